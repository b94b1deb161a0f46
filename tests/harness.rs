//! Self-tests for the Redis test harness in `tests/support`.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use support::{RedisCluster, RedisServer, Reply};

#[test]
fn server_starts_and_answers_ping() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cmd(&["PING"]), "PONG");
    assert!(server.log().contains("Ready to accept connections"));
}

#[test]
fn cmd_renders_every_reply_kind() {
    let server = RedisServer::start();
    assert_eq!(server.cmd(&["SET", "k", "v", "PX", "60000"]), "OK");
    assert_eq!(server.cmd(&["GET", "k"]), "v");
    assert_eq!(server.cmd(&["GET", "missing"]), "(nil)");
    let pttl: i64 = server.cmd(&["PTTL", "k"]).parse().expect("integer");
    assert!((1..=60_000).contains(&pttl), "PTTL {pttl}");
    assert_eq!(server.cmd_reply(&["DBSIZE"]), Reply::Int(1));
    assert_eq!(server.cmd(&["RPUSH", "list", "a", "b", "c"]), "3");
    assert_eq!(server.cmd(&["LRANGE", "list", "0", "-1"]), "a\nb\nc");
    assert_eq!(server.cmd(&["LRANGE", "nothing", "0", "-1"]), "");
    assert!(server.cmd(&["NOSUCHCOMMAND"]).starts_with("-ERR"));
    // Binary-safe arguments and values.
    assert_eq!(server.cmd(&["SET", "spaced key", "a b\r\nc"]), "OK");
    assert_eq!(server.cmd(&["GET", "spaced key"]), "a b\r\nc");
    assert!(server
        .cmd(&["INFO", "commandstats"])
        .contains("cmdstat_set:"));
}

#[test]
fn flush_scripts_forgets_cached_scripts() {
    let server = RedisServer::start();
    let sha = server.cmd(&["SCRIPT", "LOAD", "return 1"]);
    assert_eq!(server.cmd(&["EVALSHA", &sha, "0"]), "1");
    server.flush_scripts();
    assert!(server.cmd(&["EVALSHA", &sha, "0"]).starts_with("-NOSCRIPT"));
}

#[test]
fn kill_and_restart_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_eq!(server.cmd(&["SET", "k", "v"]), "OK");
    let old_pid = server.pid();

    server.kill();
    assert!(!server.is_running());
    assert!(server.try_cmd(&["PING"]).is_err(), "killed server answered");

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.cmd(&["PING"]), "PONG");
    assert_eq!(
        server.cmd(&["GET", "k"]),
        "(nil)",
        "no persistence expected"
    );

    // Restarting a running server kills it first.
    server.restart();
    assert_eq!(server.cmd(&["PING"]), "PONG");
}

#[test]
fn restart_waits_until_the_port_is_free_again() {
    let mut server = RedisServer::start();
    server.kill();
    // Someone else holds the port for a while: the first attempts fail with
    // "Address already in use" and restart() keeps trying.
    let squatter = TcpListener::bind(("127.0.0.1", server.port())).expect("bind the freed port");
    // (2 s: long enough that the first attempt meets it on a busy machine.)
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        drop(squatter);
    });
    server.restart();
    release.join().unwrap();
    assert_eq!(server.cmd(&["PING"]), "PONG");
    assert!(server.log().contains("Address already in use"));
}

#[test]
fn pause_stops_answers_until_resume() {
    let mut server = RedisServer::start();
    server.pause();

    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 64];
    let err = stream.read(&mut buf).expect_err("paused server answered");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "unexpected error: {err}"
    );

    server.resume();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let n = stream.read(&mut buf).expect("answer after resume");
    assert_eq!(&buf[..n], b"+PONG\r\n");
    assert_eq!(server.cmd(&["PING"]), "PONG");
}

#[test]
fn three_master_cluster_forms() {
    let cluster = RedisCluster::start(3);
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(cluster.urls().len(), 3);
    for (i, port) in ports.iter().enumerate() {
        assert_eq!(cluster.urls()[i], format!("redis://127.0.0.1:{port}"));
        let info = cluster.cmd(i, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
}

#[tokio::test]
async fn pool_talks_to_the_server() {
    let server = RedisServer::start();
    let pool = server.pool();
    let mut conn = pool.get().await.expect("pool connection");
    let pong: String = deadpool_redis::redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");
    let () = deadpool_redis::redis::cmd("SET")
        .arg("from-pool")
        .arg("1")
        .query_async(&mut conn)
        .await
        .expect("SET");
    assert_eq!(server.cmd(&["GET", "from-pool"]), "1");
}

#[test]
fn servers_are_isolated() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    a.cmd(&["SET", "only-in-a", "1"]);
    assert_eq!(b.cmd(&["DBSIZE"]), "0");
    let dir = a.dir().to_owned();
    drop(a);
    assert!(!dir.exists(), "temp dir not removed");
}

/// `TIME`, inside a script too, and key expiry follow the clock the test sets.
#[test]
fn a_server_clock_steps_when_the_test_says() {
    let (server, clock) = RedisServer::start_with_clock();
    let now = || -> i64 {
        let time = server.cmd(&["EVAL", "return redis.call('TIME')[1]", "0"]);
        time.parse().unwrap()
    };
    let real = now();
    clock.set_offset_us(-3_600_000_000);
    let back = now();
    assert!((real - 3_600 - back).abs() <= 2, "{real} then {back}");
    let time = server.cmd(&["TIME"]);
    let secs: i64 = time.lines().next().unwrap().parse().unwrap();
    assert!((secs - back).abs() <= 2);
    server.cmd(&["SET", "k", "v", "PX", "60000"]);
    clock.step_us(3_600_000_000);
    assert_eq!(
        server.cmd(&["EXISTS", "k"]),
        "0",
        "expired by the step forward"
    );
}
