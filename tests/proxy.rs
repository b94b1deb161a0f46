//! The fault-injecting proxy of the test support, against a real `redis-server`.

mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, AsyncCommands, AsyncConnectionConfig};
use support::proxy::FaultProxy;
use support::{raw_cmd, RedisServer, Reply};

/// Long enough that a stalled call is clearly stalled, short enough to keep tests quick.
const STALL: Duration = Duration::from_millis(300);

/// A multiplexed connection through the proxy, without redis-rs's default timeouts
/// (the tests stall calls on purpose).
async fn try_connection(proxy_url: String) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    redis::Client::open(proxy_url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn connection(proxy: &FaultProxy) -> MultiplexedConnection {
    try_connection(proxy.url()).await.unwrap()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(5), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn passes_commands_through() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    assert_eq!(proxy.connections(), 0);
    let mut conn = proxy.pool().get().await.unwrap();
    let () = conn.set("k", "v").await.unwrap();
    let got: String = conn.get("k").await.unwrap();
    assert_eq!(got, "v");
    assert_eq!(redis.cmd(&["GET", "k"]), "v");
    assert_eq!(proxy.connections(), 1);
    assert_eq!(proxy.open_connections(), 1);
    assert!(proxy.url().ends_with(&proxy.port().to_string()));
    drop(conn);
}

#[test]
fn works_from_a_plain_thread_with_latency() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let one_way = Duration::from_millis(40);
    proxy.set_latency(one_way);
    let start = Instant::now();
    assert_eq!(
        raw_cmd(proxy.port(), &["PING"]).unwrap(),
        Reply::Simple("PONG".into())
    );
    assert!(start.elapsed() >= 2 * one_way, "{:?}", start.elapsed());
    proxy.clear();
    assert_eq!(
        raw_cmd(proxy.port(), &["ECHO", "x"]).unwrap(),
        Reply::Bulk("x".into())
    );
}

#[tokio::test]
async fn latency_delays_and_keeps_order() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    let one_way = Duration::from_millis(30);
    proxy.set_latency(one_way);
    let start = Instant::now();
    // One pipeline, then three calls in flight at once on the multiplexed connection:
    // every reply comes back in order.
    let replies: Vec<i64> = (0..10)
        .fold(&mut redis::pipe(), |pipe, _| pipe.incr("n", 1))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(replies, (1..=10).collect::<Vec<i64>>());
    assert!(start.elapsed() >= 2 * one_way, "{:?}", start.elapsed());
    let (mut a, mut b, mut c) = (conn.clone(), conn.clone(), conn.clone());
    let replies = tokio::join!(
        a.incr::<_, _, i64>("n", 1),
        b.incr::<_, _, i64>("n", 1),
        c.incr::<_, _, i64>("n", 1),
    );
    assert_eq!(
        (replies.0.unwrap(), replies.1.unwrap(), replies.2.unwrap()),
        (11, 12, 13)
    );
    // Lowering the latency keeps order, too.
    proxy.set_latency(Duration::ZERO);
    let n: i64 = conn.incr("n", 1).await.unwrap();
    assert_eq!(n, 14);
}

#[tokio::test]
async fn held_replies_arrive_late_and_block_the_line() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    proxy.hold_replies(1.0, STALL);
    let start = Instant::now();
    let first = tokio::spawn({
        let mut conn = conn.clone();
        async move { redis::cmd("PING").query_async::<String>(&mut conn).await }
    });
    // Once the first reply is held, later replies queue behind it (head-of-line).
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.stats().held == 0 {
        assert!(Instant::now() < deadline, "the first reply was never held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.hold_replies(0.0, Duration::ZERO);
    let second: String = redis::cmd("ECHO")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(second, "x");
    assert!(start.elapsed() >= STALL, "{:?}", start.elapsed());
    assert_eq!(first.await.unwrap().unwrap(), "PONG");
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn lost_replies_drop_the_connection() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    proxy.lose_replies(1.0);
    let error = redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        error.is_connection_dropped() || error.is_io_error(),
        "{error:?}"
    );
    wait_until("the connection is closed", || proxy.open_connections() == 0).await;
    // The command itself reached Redis; only the reply was lost.
    proxy.clear();
    let mut conn = connection(&proxy).await;
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test]
async fn reset_closes_open_connections() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(proxy.open_connections(), 1);
    proxy.reset_connections();
    wait_until("the connection is closed", || proxy.open_connections() == 0).await;
    assert!(redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_err());
    // New connections are fine.
    let mut conn = connection(&proxy).await;
    let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
}

#[tokio::test]
async fn blackhole_stalls_until_cleared() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    let () = conn.set("k", "v").await.unwrap();
    proxy.blackhole(true);
    let call = tokio::spawn({
        let mut conn = conn.clone();
        async move { conn.get::<_, String>("k").await }
    });
    tokio::time::sleep(STALL).await;
    assert!(!call.is_finished(), "a blackholed call answered");
    assert_eq!(proxy.open_connections(), 1, "the connection stays open");
    // New connections are accepted, and stall too.
    let fresh = tokio::spawn({
        let url = proxy.url();
        async move {
            let mut conn = try_connection(url).await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        }
    });
    tokio::time::sleep(STALL).await;
    assert!(!fresh.is_finished(), "a blackholed connection answered");
    proxy.blackhole(false);
    assert_eq!(call.await.unwrap().unwrap(), "v");
    assert_eq!(fresh.await.unwrap().unwrap(), "PONG");
}

#[tokio::test]
async fn refuse_closes_new_connections() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut kept = connection(&proxy).await;
    proxy.refuse(true);
    let refused = async {
        let mut conn = try_connection(proxy.url()).await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    assert!(refused.await.is_err());
    assert_eq!(proxy.connections(), 2, "accepted, then closed");
    // Connections opened before are unaffected.
    let _: String = redis::cmd("PING").query_async(&mut kept).await.unwrap();
    proxy.clear();
    let mut conn = connection(&proxy).await;
    let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
}

#[tokio::test]
async fn upstream_down_resets_the_client() {
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    redis.kill();
    assert!(try_connection(proxy.url()).await.is_err());
    redis.restart();
    let mut conn = connection(&proxy).await;
    let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
}

#[test]
fn drop_closes_every_connection() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let port = proxy.port();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(
        raw_cmd(port, &["PING"]).unwrap(),
        Reply::Simple("PONG".into())
    );
    drop(proxy);
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    // EOF or a reset, not a timeout.
    match stream.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        ),
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

#[test]
fn faults_pick_replies_not_chunks() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let big = "x".repeat(100_000);
    // RESP3 (maps, sets, nulls, doubles), nested arrays, errors, and a reply larger
    // than one read: all sent at once, so many replies share a chunk.
    let commands: Vec<Vec<&str>> = vec![
        vec!["HELLO", "3"],
        vec!["PING"],
        vec!["SET", "big", &big],
        vec!["GET", "big"],
        vec!["GET", "missing"],
        vec!["HSET", "h", "a", "1", "b", "2"],
        vec!["HGETALL", "h"],
        vec!["SADD", "s", "x", "y"],
        vec!["SMEMBERS", "s"],
        vec!["ZADD", "z", "1.5", "m"],
        vec!["ZSCORE", "z", "m"],
        vec!["EVAL", "return {1, {2, 3}, 'x'}", "0"],
        vec!["EVAL", "return redis.error_reply('no')", "0"],
        vec!["NOSUCHCOMMAND"],
    ];
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut request = Vec::new();
    for args in &commands {
        request.extend(encode(args));
    }
    proxy.hold_replies(1.0, Duration::from_millis(1));
    std::io::Write::write_all(&mut stream, &request).unwrap();
    let start = Instant::now();
    let mut sink = vec![0u8; 64 * 1024];
    while proxy.stats().replies < commands.len() as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            proxy.stats()
        );
        let _ = stream.read(&mut sink);
    }
    // Drain what is left, then count.
    while stream.read(&mut sink).is_ok_and(|n| n > 0) {}
    let stats = proxy.stats();
    assert_eq!(stats.replies, commands.len() as u64, "{stats:?}");
    assert_eq!(stats.held, stats.replies, "{stats:?}");
    assert!(
        stats.chunks_down >= 2,
        "the big reply spans reads: {stats:?}"
    );
}

#[tokio::test]
async fn a_fraction_of_pipelined_replies_is_held() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let mut conn = connection(&proxy).await;
    let before = proxy.stats();
    proxy.hold_replies(0.5, Duration::from_millis(1));
    let replies: Vec<String> = (0..200)
        .fold(&mut redis::pipe(), |pipe, _| pipe.cmd("PING"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(replies.len(), 200);
    let stats = proxy.stats();
    assert_eq!(stats.replies - before.replies, 200, "{stats:?}");
    // Per reply, not per chunk: far more than the few chunks 200 PONGs arrive in.
    let held = stats.held - before.held;
    assert!((40..=160).contains(&held), "{stats:?}");
}
