//! The scenarios, one per row of the table: each starts its own `redis-server` and
//! fault proxy, runs its load and returns its rows of the report.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Scenarios, one per row of the table
// ---------------------------------------------------------------------------

/// Row 1: 0.2% of replies held 150 ms past the default 100 ms call timeout, two
/// instances sharing one Redis and one quota.
pub(crate) async fn held_replies(settings: &Settings) -> Vec<Row> {
    const SCENARIO: &str = "0.2% of replies held 150 ms";
    const QUOTA: u64 = 100;
    const KEYS: usize = 8;
    // Each instance offers 2x the quota of every key, 4x together.
    const RATE: f64 = (QUOTA * KEYS as u64 * 2) as f64;
    let period = Duration::from_secs(1);
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let instances: Vec<Instance> = (0..2)
        .map(|_| instance(default_backend(&proxy.url()), QUOTA, period))
        .collect();
    let keys = keys(KEYS);
    let measure = settings.window(1.0);

    let clock = Instant::now();
    let watches: Vec<_> = instances
        .iter()
        .map(|i| watch_switches(&i.backend, clock))
        .collect();
    let load = open_loop(instances.clone(), keys, RATE, WARM_UP + measure, clock);
    tokio::time::sleep(WARM_UP).await;
    proxy.hold_replies(0.002, Duration::from_millis(150));
    let samples = load.await.expect("the load");
    proxy.clear();
    eprintln!("  proxy: {:?}", proxy.stats());
    let switches: Vec<Switches> = watches.into_iter().map(SwitchWatch::finish).collect();

    let window = between(WARM_UP, WARM_UP + measure);
    let per_instance: Vec<usize> = switches
        .iter()
        .map(|s| s.count_between(WARM_UP, WARM_UP + measure))
        .collect();
    let total: usize = per_instance.iter().sum();
    let windows = measure.as_secs_f64() / period.as_secs_f64();
    let ratio = samples.admitted(&window) as f64 / (QUOTA as f64 * KEYS as f64 * windows);
    let scale = 10.0 / measure.as_secs_f64();
    log_run(
        SCENARIO,
        &samples,
        switches.iter().map(Switches::count).sum(),
    );
    vec![
        row(
            SCENARIO,
            "backend switches per 10 s (both instances)",
            format!(
                "{:.0} ({} + {} in {:.0} s)",
                total as f64 * scale,
                per_instance[0],
                per_instance[1],
                measure.as_secs_f64()
            ),
            "0",
        ),
        row(
            SCENARIO,
            "decisions from Redis",
            pct(samples.on_redis(&window)),
            "all but those whose own call failed (≈ 99.8%)",
        ),
        row(
            SCENARIO,
            "admitted / quota (2 instances, 4x offered)",
            format!("{ratio:.2}x"),
            "≤ 1.5x",
        ),
    ]
}

/// Row 2: one key holds a value of the wrong type.
pub(crate) async fn wrong_type(settings: &Settings) -> Vec<Row> {
    const SCENARIO: &str = "one key WRONGTYPE";
    const KEYS: usize = 5;
    const BAD: usize = 0;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let one = instance(
        default_backend(&proxy.url()),
        UNLIMITED,
        Duration::from_secs(60),
    );
    check_key_layout(&redis, &one).await;
    let keys = keys(KEYS);
    // A list where the script expects a counter: `GET` answers WRONGTYPE.
    let bad = redis_key(PREFIX, KIND, NAME, &keys[BAD]);
    redis.cmd(&["RPUSH", &bad, "not-a-counter"]);
    let measure = settings.window(1.5);

    let clock = Instant::now();
    let watch = watch_switches(&one.backend, clock);
    let samples = open_loop(vec![one], keys, 400.0, measure, clock)
        .await
        .expect("the load");
    let switches = watch.finish();
    assert_eq!(
        redis.cmd(&["TYPE", &bad]),
        "list",
        "the bad key was replaced"
    );
    log_run(SCENARIO, &samples, switches.count());
    vec![
        row(
            SCENARIO,
            "other keys' decisions from Redis",
            pct(samples.on_redis(|s| s.key != BAD)),
            "≥ 99%",
        ),
        row(
            SCENARIO,
            "the bad key's decisions from Redis",
            pct(samples.on_redis(|s| s.key == BAD)),
            "(its layer's failure policy decides)",
        ),
        row(
            SCENARIO,
            &format!("switches in {:.0} s", measure.as_secs_f64()),
            switches.count().to_string(),
            "0",
        ),
        row(
            SCENARIO,
            &format!("transitions both ways in {:.0} s", measure.as_secs_f64()),
            switches
                .transitions_between(Duration::ZERO, Duration::MAX)
                .to_string(),
            "0",
        ),
    ]
}

/// Row 3: Redis answers `PING` but refuses writes, first `OOM`, then `READONLY`.
pub(crate) async fn refused_writes(settings: &Settings) -> Vec<Row> {
    let mut rows = Vec::new();
    // OOM: no memory left for a write, and nothing may be evicted.
    rows.extend(
        refused_writes_run(
            settings,
            "writes refused: OOM",
            |redis| {
                redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
                redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                None
            },
            |redis, _| {
                redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            },
        )
        .await,
    );
    // READONLY: the server becomes a replica of another, throw-away one.
    rows.extend(
        refused_writes_run(
            settings,
            "writes refused: READONLY",
            |redis| {
                let primary = RedisServer::start();
                let port = primary.port().to_string();
                redis.cmd(&["REPLICAOF", "127.0.0.1", &port]);
                Some(primary)
            },
            |redis, primary| {
                redis.cmd(&["REPLICAOF", "NO", "ONE"]);
                drop(primary);
            },
        )
        .await,
    );
    rows
}

pub(crate) async fn refused_writes_run(
    settings: &Settings,
    scenario: &str,
    fault: impl FnOnce(&RedisServer) -> Option<RedisServer>,
    clear: impl FnOnce(&RedisServer, Option<RedisServer>),
) -> Vec<Row> {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let one = instance(
        default_backend(&proxy.url()),
        UNLIMITED,
        Duration::from_secs(60),
    );
    let measure = settings.window(1.5);
    let after = Duration::from_secs(4);

    let clock = Instant::now();
    let watch = watch_switches(&one.backend, clock);
    let load = open_loop(vec![one], keys(5), 200.0, WARM_UP + measure + after, clock);
    tokio::time::sleep(WARM_UP).await;
    let logs_before = log_lines();
    let extra = blocking(|| fault(&redis));
    tokio::time::sleep_until(clock + WARM_UP + measure).await;
    let logs = log_lines();
    let (warns, lines) = (logs.0 - logs_before.0, logs.1 - logs_before.1);
    let cleared = clock.elapsed();
    blocking(|| clear(&redis, extra));
    let samples = load.await.expect("the load");
    let switches = watch.finish();
    log_run(scenario, &samples, switches.count());
    let during = switches.count_between(WARM_UP, cleared);
    vec![
        row(
            scenario,
            "switches during the fault",
            within(during, cleared - WARM_UP),
            "≤ 2 a minute",
        ),
        row(
            scenario,
            "warn log lines during the fault",
            within(
                usize::try_from(warns).unwrap_or(usize::MAX),
                cleared - WARM_UP,
            ),
            "≤ 10 a minute",
        ),
        row(
            scenario,
            "transitions both ways / log lines at info+ during the fault",
            format!(
                "{} / {}",
                within(
                    switches.transitions_between(WARM_UP, cleared),
                    cleared - WARM_UP
                ),
                within(
                    usize::try_from(lines).unwrap_or(usize::MAX),
                    cleared - WARM_UP
                )
            ),
            "",
        ),
        row(
            scenario,
            "decisions from Redis during the fault",
            pct(samples.on_redis(between(WARM_UP, cleared))),
            "0% (stays in fallback)",
        ),
    ]
    .into_iter()
    .chain(back_on_redis(
        scenario,
        "the fault clears",
        &samples,
        cleared,
        after,
        "≥ 95%",
    ))
    .collect()
}

/// Row 4: a round trip above half the call timeout, then a 2 s partition.
pub(crate) async fn slow_round_trip(settings: &Settings) -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(
        slow_round_trip_run(
            settings,
            "RTT 70 ms, defaults",
            Duration::from_millis(35),
            None,
        )
        .await,
    );
    // The partition alone, on a round trip well inside the default timeout.
    rows.extend(
        slow_round_trip_run(
            settings,
            "RTT 10 ms, defaults",
            Duration::from_millis(5),
            None,
        )
        .await,
    );
    rows.extend(
        slow_round_trip_run(
            settings,
            "RTT 160 ms, call_timeout 250 ms",
            Duration::from_millis(80),
            Some(Duration::from_millis(250)),
        )
        .await,
    );
    rows
}

pub(crate) async fn slow_round_trip_run(
    settings: &Settings,
    scenario: &str,
    one_way: Duration,
    call_timeout: Option<Duration>,
) -> Vec<Row> {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(one_way);
    let mut builder = Backend::builder().redis_url(proxy.url());
    if let Some(timeout) = call_timeout {
        builder = builder.call_timeout(timeout);
    }
    let one = instance(
        builder.build().expect("a valid backend"),
        UNLIMITED,
        Duration::from_secs(60),
    );
    let measure = settings.window(0.8);
    let partition = Duration::from_secs(2);
    let after = Duration::from_secs(6);

    let clock = Instant::now();
    let watch = watch_switches(&one.backend, clock);
    let load = open_loop(
        vec![one],
        keys(5),
        100.0,
        measure + partition + after,
        clock,
    );
    tokio::time::sleep(measure).await;
    proxy.blackhole(true);
    tokio::time::sleep(partition).await;
    proxy.blackhole(false);
    let healed = clock.elapsed();
    let samples = load.await.expect("the load");
    let switches = watch.finish();
    log_run(scenario, &samples, switches.count());
    vec![
        row(
            scenario,
            &format!("decisions from Redis ({:.0} s)", measure.as_secs_f64()),
            pct(samples.on_redis(between(Duration::ZERO, measure))),
            "≥ 95%",
        ),
        row(
            scenario,
            &format!("switches in those {:.0} s", measure.as_secs_f64()),
            switches.count_between(Duration::ZERO, measure).to_string(),
            "",
        ),
    ]
    .into_iter()
    .chain(back_on_redis(
        scenario,
        "a 2 s partition",
        &samples,
        healed,
        after,
        "≥ 95%",
    ))
    .collect()
}

/// Row 5: Redis down for 3 s under 400 req/s at 10 and 30 ms RTT; then a cold start with
/// 32 checks in flight at 10 ms RTT.
pub(crate) async fn restart(settings: &Settings) -> Vec<Row> {
    let mut rows = Vec::new();
    for rtt_ms in [10, 30] {
        rows.extend(restart_run(rtt_ms).await);
    }
    rows.extend(cold_start(settings).await);
    rows
}

pub(crate) async fn restart_run(rtt_ms: u64) -> Vec<Row> {
    let scenario = format!("Redis down 3 s, 400 req/s, RTT {rtt_ms} ms");
    let scenario = scenario.as_str();
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(Duration::from_millis(rtt_ms / 2));
    let one = instance(
        default_backend(&proxy.url()),
        UNLIMITED,
        Duration::from_secs(60),
    );
    let before = Duration::from_secs(2);
    let down = Duration::from_secs(3);
    let after = Duration::from_secs(6);

    let clock = Instant::now();
    let watch = watch_switches(&one.backend, clock);
    // Long enough for the 6 s after the restart whatever the restart itself takes.
    let load = open_loop(
        vec![one],
        keys(5),
        400.0,
        before + down + after + Duration::from_secs(1),
        clock,
    );
    tokio::time::sleep(before).await;
    blocking(|| redis.kill());
    let killed = clock.elapsed();
    tokio::time::sleep(down).await;
    blocking(|| redis.restart());
    let back = clock.elapsed();
    let samples = load.await.expect("the load");
    let switches = watch.finish();
    log_run(scenario, &samples, switches.count());
    let mut rows = back_on_redis(
        scenario,
        "it returns",
        &samples,
        back,
        after,
        "≥ 95% (within 2 s)",
    )
    .to_vec();
    rows.push(row(
        scenario,
        "switches (from the kill on)",
        switches.count_between(killed, Duration::MAX).to_string(),
        "≤ 1",
    ));
    rows
}

pub(crate) async fn cold_start(settings: &Settings) -> Vec<Row> {
    const SCENARIO: &str = "cold start, 32 in flight, RTT 10 ms";
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(Duration::from_millis(5));
    let one = instance(
        default_backend(&proxy.url()),
        UNLIMITED,
        Duration::from_secs(60),
    );
    let run = settings.window(0.8);

    let clock = Instant::now();
    let watch = watch_switches(&one.backend, clock);
    let samples = closed_loop(one, keys(32), 32, run, clock)
        .await
        .expect("the load");
    let switches = watch.finish();
    log_run(SCENARIO, &samples, switches.count());
    let last = run.saturating_sub(Duration::from_secs(2));
    vec![
        row(
            SCENARIO,
            &format!("decisions from Redis ({:.0} s)", run.as_secs_f64()),
            pct(samples.on_redis(|_| true)),
            "settles on Redis",
        ),
        row(
            SCENARIO,
            "decisions from Redis in the last 2 s",
            pct(samples.on_redis(between(last, run))),
            "≥ 95%",
        ),
        row(
            SCENARIO,
            &format!("switches in {:.0} s", run.as_secs_f64()),
            switches.count().to_string(),
            "≤ 1",
        ),
    ]
}

/// Row 6: 32 checks in flight at 10 ms RTT; decision latency with the crate's own
/// connection (`redis_url`), and with a pool whose connections have `TCP_NODELAY` on (the
/// reference).
pub(crate) async fn latency(settings: &Settings) -> Vec<Row> {
    let mut rows = Vec::new();
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(Duration::from_millis(5));
    let runs = [
        (
            "32 in flight, RTT 10 ms, `redis_url` (the crate's own connection)",
            default_backend(&proxy.url()),
        ),
        (
            "32 in flight, RTT 10 ms, deadpool pool with TCP_NODELAY forced on (reference)",
            Backend::builder()
                .redis(nodelay_pool(&proxy.url()))
                .build()
                .expect("a valid backend"),
        ),
    ];
    for (scenario, backend) in runs {
        let one = instance(backend, UNLIMITED, Duration::from_secs(60));
        // Settled first (kept connection, script loaded): a cold start with 32 in flight
        // is row 5's; this row measures the round trips.
        settle(&one).await;
        let clock = Instant::now();
        let watch = watch_switches(&one.backend, clock);
        let run = WARM_UP + settings.window(0.5);
        let samples = closed_loop(one, keys(32), 32, run, clock)
            .await
            .expect("the load");
        let switches = watch.finish();
        log_run(scenario, &samples, switches.count());
        let measured = |s: &Sample| s.at >= WARM_UP && s.on_redis();
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "n/a".to_owned(),
                |d| format!("{:.1} ms", d.as_secs_f64() * 1e3),
            )
        };
        rows.push(row(
            scenario,
            "p50 decision latency",
            ms(samples.latency(0.5, measured)),
            "≈ RTT (TCP_NODELAY on)",
        ));
        rows.push(row(
            scenario,
            "p99 decision latency",
            ms(samples.latency(0.99, measured)),
            "",
        ));
        rows.push(row(
            scenario,
            "decisions from Redis / per second",
            format!(
                "{} / {:.0}",
                pct(samples.on_redis(|s| s.at >= WARM_UP)),
                samples.count(|s| s.at >= WARM_UP) as f64 / (run - WARM_UP).as_secs_f64()
            ),
            "",
        ));
    }
    rows
}

/// A pool with wait, create and recycle timeouts of 100 ms (the backend's call timeout)
/// whose connections have `TCP_NODELAY` on.
pub(crate) fn nodelay_pool(url: &str) -> deadpool_redis::Pool {
    use deadpool_redis::redis::io::tcp::TcpSettings;
    use deadpool_redis::redis::IntoConnectionInfo;
    let timeout = Some(Duration::from_millis(100));
    let info = url
        .into_connection_info()
        .expect("a valid Redis URL")
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let manager = deadpool_redis::Manager::new(info).expect("a valid Redis URL");
    deadpool_redis::Pool::builder(manager)
        .runtime(Runtime::Tokio1)
        .wait_timeout(timeout)
        .create_timeout(timeout)
        .recycle_timeout(timeout)
        .build()
        .expect("a pool")
}
