//! The soak (issue 53): several app instances on one Redis under a steady load for as long
//! as asked, Redis killed and restarted empty on a schedule, memory and file descriptors
//! sampled, every admission checked against the documented bound; it states its budgets
//! and fails the run past any of them.
//!
//! ```text
//! scripts/soak                                   # one hour, the release build
//! SOAK_SECS=120 scripts/soak                     # two minutes
//! CHAOS_ONLY=soak SOAK_SECS=300 cargo bench --bench chaos
//! ```
//!
//! Each instance is one [`Backend`] (`redis_url`, the crate's defaults but a bound of
//! [`MAX_LOCAL_KEYS`] in-process keys) and one axum `Router`
//! with a route per algorithm (`/period`, `/token`, `/rolling`), called in process
//! through the layers as a server would (`Service::call`, the body read to its end). The
//! handler answers with the [`Source`] of its decision, so every admission is known to
//! have come from Redis or from the fallback.
//!
//! The bound (`guide::failure_modes`): on Redis, across every instance, each limit holds
//! exactly; while a restart or a fallback decision is within reach of an interval, each
//! instance may admit the whole limit from its own state and Redis forgets what it had
//! counted, so that interval may hold `(2 + instances)` times the limit. Times are unix
//! time read before and after each request (Redis's `TIME` is the same clock); an
//! admission is only counted in an interval it certainly fell within.
//!
//! Environment: `SOAK_SECS` (3600), `SOAK_RESTART_EVERY` (45 s), `SOAK_DOWN` (2 s),
//! `SOAK_RATE` (300 requests a second, all instances together), `SOAK_INSTANCES` (3),
//! `SOAK_CHURN` (one request in 10 on a new key; 0: none).

#[allow(unused_imports)]
use super::*;

use std::collections::VecDeque;
use std::time::SystemTime;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use tower::ServiceExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{Decision, LimitLayer, RollingConfig, TokenBucketConfig, UtcOffset};

const SCENARIO: &str = "soak";
/// Hot keys per route: each is offered more than its limit.
const HOT_KEYS: usize = 20;
/// Each instance's in-process bound (`max_local_keys`): the fallback keeps the new keys
/// of every outage, so a small bound is reached within the hour, as a long-lived
/// service's is, and memory must then stay flat.
const MAX_LOCAL_KEYS: u64 = 1_000;
const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;

/// The three routes, their limits, and the bound each admission is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// 2 per second, windows aligned on the second.
    Period,
    /// A burst of 2, then one a second.
    Token,
    /// 4 in any 5 s (10 buckets of 500 ms).
    Rolling,
}

const ROUTES: [Route; 3] = [Route::Period, Route::Token, Route::Rolling];

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Period => "/period",
            Route::Token => "/token",
            Route::Rolling => "/rolling",
        }
    }

    /// The interval an admission is judged over (µs), and at most how many admissions of
    /// one key it may hold on Redis.
    fn bound(self) -> (u64, u64) {
        match self {
            // Exact windows: the aligned second holding the admission.
            Route::Period => (SEC, 2),
            // Any 5 s hold at most the burst and one per second.
            Route::Token => (5 * SEC, 2 + 5),
            // Any 4.5 s lie within 10 consecutive buckets; 2 ms spare for Redis's
            // millisecond clock.
            Route::Rolling => (4_500 * MS - 2 * MS, 4),
        }
    }
}

fn router(backend: &Backend) -> Router {
    let second = Duration::from_secs(1);
    let key = || HeaderKey::from_static("x-api-key");
    let period = LimitLayer::builder(backend, PeriodConfig::new(2, second).align(UtcOffset::UTC))
        .name("soak-period")
        .key(key())
        .build()
        .expect("a valid period limit");
    let token = LimitLayer::builder(backend, TokenBucketConfig::new(1, second, 2))
        .name("soak-token")
        .key(key())
        .build()
        .expect("a valid token bucket");
    let rolling = LimitLayer::builder(
        backend,
        RollingConfig::new(4, 10, Duration::from_millis(500)),
    )
    .name("soak-rolling")
    .key(key())
    .build()
    .expect("a valid rolling window");
    Router::new()
        .route("/period", get(source).layer(period))
        .route("/token", get(source).layer(token))
        .route("/rolling", get(source).layer(rolling))
}

/// The handler: which store admitted the request.
async fn source(Extension(decision): Extension<Decision>) -> &'static str {
    match decision.source {
        Source::Redis | Source::DenyCache | Source::Lease => "redis",
        Source::Fallback => "fallback",
        _ => "other",
    }
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[derive(Debug, Clone)]
struct SoakSettings {
    run: Duration,
    restart_every: Duration,
    down: Duration,
    rate: f64,
    instances: usize,
    /// One request in `churn` is on a key never seen before (a new client); 0: none.
    churn: u64,
}

fn env_secs(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().map_or(default, |s| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .unwrap_or_else(|| panic!("{name} must be a positive number"))
    })
}

impl SoakSettings {
    fn from_env() -> Self {
        let run = env_secs("SOAK_SECS", 3600.0);
        let instances = env_secs("SOAK_INSTANCES", 3.0) as usize;
        assert!(run <= 86_400.0, "SOAK_SECS must be at most a day");
        assert!(
            (1..=16).contains(&instances),
            "SOAK_INSTANCES must be 1..=16"
        );
        Self {
            run: Duration::from_secs_f64(run),
            restart_every: Duration::from_secs_f64(env_secs("SOAK_RESTART_EVERY", 45.0)),
            down: Duration::from_secs_f64(env_secs("SOAK_DOWN", 2.0)),
            rate: env_secs("SOAK_RATE", 300.0).min(5_000.0),
            instances,
            churn: std::env::var("SOAK_CHURN").map_or(10, |n| {
                n.parse()
                    .expect("SOAK_CHURN must be a whole number (0: no new keys)")
            }),
        }
    }
}

/// A latency histogram of fixed size: buckets 2% apart from 1 µs to about 100 s.
struct Histogram {
    counts: Vec<u64>,
    max: Duration,
}

impl Histogram {
    const STEP: f64 = 1.02;

    fn new() -> Self {
        Self {
            counts: vec![0; 950],
            max: Duration::ZERO,
        }
    }

    fn record(&mut self, d: Duration) {
        let us = d.as_secs_f64() * 1e6;
        let i = if us <= 1.0 {
            0
        } else {
            (us.ln() / Self::STEP.ln()) as usize
        };
        let last = self.counts.len() - 1;
        self.counts[i.min(last)] += 1;
        self.max = self.max.max(d);
    }

    fn quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.counts.iter().sum();
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank && total > 0 {
                return Some(Duration::from_secs_f64(Self::STEP.powi(i as i32 + 1) / 1e6));
            }
        }
        None
    }
}

/// The admissions of one hot key still within reach of a check.
#[derive(Default)]
struct KeyLog {
    /// `(start, end)` of each admission (µs).
    admits: VecDeque<(u64, u64)>,
    /// `(window, admissions)` of the aligned windows (the period route).
    windows: VecDeque<(u64, u64)>,
}

/// Everything the run saw, behind one lock (taken once per request).
struct Record {
    instances: u64,
    /// Intervals (µs) within reach of a restart or a fallback decision; `u64::MAX` ends
    /// the one still open.
    faults: Vec<(u64, u64)>,
    keys: Vec<Vec<KeyLog>>,
    requests: u64,
    errors: u64,
    first_errors: Vec<String>,
    admitted: u64,
    checked: u64,
    ambiguous: u64,
    violations: u64,
    /// Per route, in the order of [`ROUTES`].
    violations_by_route: [u64; 3],
    first_violations: Vec<String>,
    /// Decisions whose interval touched no fault, and the admissions among them: all,
    /// and those from Redis (a refusal does not say which store refused).
    clean: u64,
    clean_admitted: u64,
    clean_on_redis: u64,
    fallback_outside: u64,
    clean_latency: Histogram,
    all_latency: Histogram,
}

impl Record {
    fn new(instances: usize) -> Self {
        Self {
            instances: instances as u64,
            faults: Vec::new(),
            keys: ROUTES
                .iter()
                .map(|_| (0..HOT_KEYS).map(|_| KeyLog::default()).collect())
                .collect(),
            requests: 0,
            errors: 0,
            first_errors: Vec::new(),
            admitted: 0,
            checked: 0,
            ambiguous: 0,
            violations: 0,
            violations_by_route: [0; 3],
            first_violations: Vec::new(),
            clean: 0,
            clean_admitted: 0,
            clean_on_redis: 0,
            fallback_outside: 0,
            clean_latency: Histogram::new(),
            all_latency: Histogram::new(),
        }
    }

    fn faulted(&self, from: u64, to: u64) -> bool {
        self.faults.iter().rev().any(|&(a, b)| a <= to && from <= b)
    }

    /// Marks `from..to` as within reach of a fault, merged with the last one when they
    /// touch (the list grows by one entry per restart or lone fallback decision).
    fn fault(&mut self, from: u64, to: u64) {
        match self.faults.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => self.faults.push((from, to)),
        }
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(what);
        }
    }

    fn violation(&mut self, what: String) {
        self.violations += 1;
        if self.first_violations.len() < 5 {
            self.first_violations.push(what);
        }
    }

    fn done(&mut self, route: Route, hot: Option<usize>, start: u64, end: u64, answer: Answer) {
        self.requests += 1;
        let latency = Duration::from_micros(end.saturating_sub(start));
        self.all_latency.record(latency);
        let fallback = matches!(answer, Answer::Admitted { fallback: true });
        if fallback {
            // A second of reach on either side covers what the instance's state counted.
            let in_outage = self.faulted(start, end);
            if !in_outage {
                self.fallback_outside += 1;
            }
            self.fault(start.saturating_sub(SEC), end + SEC);
        }
        if !self.faulted(start, end) {
            self.clean += 1;
            self.clean_latency.record(latency);
            if let Answer::Admitted { fallback } = answer {
                self.clean_admitted += 1;
                self.clean_on_redis += u64::from(!fallback);
            }
        }
        let Answer::Admitted { .. } = answer else {
            return;
        };
        self.admitted += 1;
        let Some(hot) = hot else { return };
        self.check(route, hot, start, end);
    }

    /// Holds one admission of a hot key to the bound, in the interval ending with it.
    fn check(&mut self, route: Route, hot: usize, start: u64, end: u64) {
        let (span, limit) = route.bound();
        let route_index = ROUTES.iter().position(|r| *r == route).unwrap_or(0);
        let faulted_bound = limit * (2 + self.instances);
        let (count, from) = {
            let log = &mut self.keys[route_index][hot];
            if route == Route::Period {
                let window = start / span;
                if end / span != window {
                    self.ambiguous += 1;
                    return;
                }
                while log.windows.front().is_some_and(|&(w, _)| w + 4 < window) {
                    log.windows.pop_front();
                }
                let count = match log.windows.iter_mut().find(|(w, _)| *w == window) {
                    Some((_, n)) => {
                        *n += 1;
                        *n
                    }
                    None => {
                        log.windows.push_back((window, 1));
                        1
                    }
                };
                (count, window * span)
            } else {
                let from = end.saturating_sub(span);
                while log.admits.front().is_some_and(|&(_, e)| e + 2 * span < end) {
                    log.admits.pop_front();
                }
                let earlier = log
                    .admits
                    .iter()
                    .filter(|&&(s, e)| s >= from && e <= end)
                    .count() as u64;
                log.admits.push_back((start, end));
                (earlier + 1, from)
            }
        };
        self.checked += 1;
        let faulted = self.faulted(from, end);
        let bound = if faulted { faulted_bound } else { limit };
        if count > bound {
            self.violations_by_route[route_index] += 1;
            self.violation(format!(
                "{} key {hot}: {count} admissions in {:.3}..{:.3} s (unix), bound {bound}{}",
                route.path(),
                from as f64 / 1e6,
                end as f64 / 1e6,
                if faulted { " (faulted)" } else { "" }
            ));
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Answer {
    Admitted { fallback: bool },
    Refused,
}

/// One sample of the process: `(seconds since the start, RSS in KiB, open descriptors)`.
type Usage = (f64, u64, usize);

fn usage(started: Instant) -> Usage {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    (started.elapsed().as_secs_f64(), rss, fds)
}

/// What the restart schedule saw.
#[derive(Default)]
struct Restarts {
    /// From Redis answering again to every instance healthy on it.
    back: Vec<Duration>,
    never_back: usize,
    /// Keys in Redis just before each kill.
    keys_before: Vec<u64>,
    /// When the first restart was over (the memory baseline's time).
    first_over: Option<f64>,
}

async fn one_request(
    router: Router,
    route: Route,
    key: String,
) -> (Result<Answer, String>, u64, u64) {
    let start = unix_us();
    let request = axum::http::Request::get(route.path())
        .header("x-api-key", key)
        .body(Body::empty())
        .expect("a request");
    let answer = match router.oneshot(request).await {
        Ok(response) => {
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await;
            match (status.as_u16(), body.as_deref()) {
                (200, Ok(b"redis")) => Ok(Answer::Admitted { fallback: false }),
                (200, Ok(b"fallback")) => Ok(Answer::Admitted { fallback: true }),
                (429, Ok(_)) => Ok(Answer::Refused),
                (status, body) => Err(format!("{} answered {status}: {body:?}", route.path())),
            }
        }
        Err(never) => match never {},
    };
    (answer, start, unix_us())
}

/// Runs the soak and returns its rows; the second value is whether every budget held.
pub(crate) async fn soak() -> (Vec<Row>, bool) {
    let settings = SoakSettings::from_env();
    eprintln!("  {settings:?}");
    let mut redis = RedisServer::start();
    let backends: Vec<Backend> = (0..settings.instances)
        .map(|_| {
            Backend::builder()
                .redis_url(redis.url())
                .max_local_keys(MAX_LOCAL_KEYS)
                .build()
                .expect("a valid backend")
        })
        .collect();
    for backend in &backends {
        backend.warm_up().await.expect("Redis answers at the start");
    }
    let routers: Vec<Router> = backends.iter().map(router).collect();
    let record = Arc::new(Mutex::new(Record::new(settings.instances)));
    let started = Instant::now();
    let (warns_before, lines_before) = log_lines();
    let end = started + settings.run;
    // Ctrl-C or SIGTERM ends the run early, with its report, and no server left behind.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let running = {
        let stop = Arc::clone(&stop);
        move || Instant::now() < end && !stop.load(Ordering::Relaxed)
    };
    tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("  stopping early: the report covers the run so far");
            stop.store(true, Ordering::Relaxed);
        }
    });

    // The load: an open loop at a fixed rate, instances, routes and keys in turn.
    let load = tokio::spawn({
        let record = Arc::clone(&record);
        let rate = settings.rate;
        let churn = settings.churn;
        let running = running.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
            let mut inflight = JoinSet::new();
            let mut n: u64 = 0;
            let mut random: u64 = 0x9e37_79b9_7f4a_7c15;
            while running() {
                tick.tick().await;
                n += 1;
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                let router = routers[(n as usize) % routers.len()].clone();
                let route = ROUTES[((n / routers.len() as u64) % 3) as usize];
                let (hot, key) = if churn > 0 && random % churn == 0 {
                    (None, format!("new-{n}"))
                } else {
                    let hot = ((random >> 8) % HOT_KEYS as u64) as usize;
                    (Some(hot), format!("hot-{hot}"))
                };
                let shared = Arc::clone(&record);
                inflight.spawn(async move {
                    let (answer, start, end) = one_request(router, route, key).await;
                    let mut record = shared.lock().expect("the record");
                    match answer {
                        Ok(answer) => record.done(route, hot, start, end, answer),
                        Err(error) => {
                            record.requests += 1;
                            record.error(error);
                        }
                    }
                });
                while let Some(done) = inflight.try_join_next() {
                    if let Err(panic) = done {
                        record
                            .lock()
                            .expect("the record")
                            .error(format!("a request task: {panic}"));
                    }
                }
            }
            while let Some(done) = inflight.join_next().await {
                if let Err(panic) = done {
                    record
                        .lock()
                        .expect("the record")
                        .error(format!("a request task: {panic}"));
                }
            }
        }
    });

    // Memory and descriptors, every second.
    let sampler = tokio::spawn({
        let running = running.clone();
        async move {
            let mut samples: Vec<Usage> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while running() {
                tick.tick().await;
                samples.push(usage(started));
            }
            samples
        }
    });

    // The schedule: Redis killed, down, restarted empty, every `restart_every`.
    let mut restarts = Restarts::default();
    let mut last_report = Instant::now();
    loop {
        let next = Instant::now() + settings.restart_every;
        if next + settings.down + Duration::from_secs(10) > end {
            break;
        }
        while Instant::now() < next && running() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if last_report.elapsed() >= Duration::from_secs(60) {
                last_report = Instant::now();
                let (at, rss, fds) = usage(started);
                let r = record.lock().expect("the record");
                eprintln!(
                    "  {at:.0} s: {} requests, {} errors, {} violations, RSS {} KiB, {fds} fds",
                    r.requests, r.errors, r.violations, rss
                );
            }
        }
        if !running() {
            break;
        }
        let keys = redis.cmd(&["DBSIZE"]).trim().parse().unwrap_or(u64::MAX);
        restarts.keys_before.push(keys);
        record
            .lock()
            .expect("the record")
            .fault(unix_us(), u64::MAX);
        blocking(|| redis.kill());
        tokio::time::sleep(settings.down).await;
        blocking(|| redis.restart());
        let answering = Instant::now();
        let healthy = || {
            backends
                .iter()
                .all(|b| b.redis_state() == Some(RedisState::Healthy))
        };
        while !healthy() && answering.elapsed() < Duration::from_secs(15) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if healthy() {
            restarts.back.push(answering.elapsed());
        } else {
            restarts.never_back += 1;
        }
        // The outage's reach ends a second after the last instance is back (an
        // interval ending later may still hold the fallback's admissions: the
        // fallback decisions themselves extend it).
        {
            let mut r = record.lock().expect("the record");
            if let Some(last) = r.faults.last_mut() {
                last.1 = unix_us() + SEC;
            }
        }
        if restarts.first_over.is_none() {
            restarts.first_over = Some(started.elapsed().as_secs_f64() + 5.0);
        }
    }
    load.await.expect("the load");
    let samples = sampler.await.expect("the sampler");
    let (warns, lines) = log_lines();
    let switches: u64 = backends.iter().filter_map(Backend::redis_switches).sum();
    let record = Arc::try_unwrap(record)
        .ok()
        .expect("the load is over")
        .into_inner()
        .expect("the record");
    report(
        &settings,
        &record,
        &restarts,
        &samples,
        (warns - warns_before, lines - lines_before, switches),
        started.elapsed(),
    )
}

/// The rows of the report, each figure against its budget.
fn report(
    settings: &SoakSettings,
    r: &Record,
    restarts: &Restarts,
    samples: &[Usage],
    (warns, lines, switches): (u64, u64, u64),
    took: Duration,
) -> (Vec<Row>, bool) {
    let mut rows = Vec::new();
    let mut ok = true;
    let mut budget = |figure: &str, value: String, target: &str, within: bool| {
        ok &= within;
        let mark = if within { "" } else { " **over budget**" };
        rows.push(row(SCENARIO, figure, format!("{value}{mark}"), target));
    };
    let n = settings.instances as u64;
    let cycles = restarts.back.len() + restarts.never_back;
    budget(
        "run",
        format!(
            "{:.0} s, {} instances, {:.0} req/s offered, Redis restarted {cycles} times ({:.0} s down each, every {:.0} s)",
            took.as_secs_f64(),
            n,
            settings.rate,
            settings.down.as_secs_f64(),
            settings.restart_every.as_secs_f64()
        ),
        "",
        true,
    );
    budget(
        "requests answered / per second",
        format!(
            "{} / {:.0}",
            r.requests,
            r.requests as f64 / took.as_secs_f64()
        ),
        "",
        r.requests > 0,
    );
    budget(
        "errors (an answer other than 200 or 429, a panic)",
        format!(
            "{}{}",
            r.errors,
            if r.first_errors.is_empty() {
                String::new()
            } else {
                format!(": {:?}", r.first_errors)
            }
        ),
        "0",
        r.errors == 0,
    );
    budget(
        "admissions over the documented bound",
        format!(
            "{} of {} checked (period / token / rolling {:?}; {} admitted in all; {} across a window edge not counted){}",
            r.violations,
            r.checked,
            r.violations_by_route,
            r.admitted,
            r.ambiguous,
            if r.first_violations.is_empty() { String::new() } else { format!(": {:?}", r.first_violations) }
        ),
        "0",
        r.violations == 0 && r.checked > 0,
    );
    let share = r.clean_on_redis as f64 / r.clean_admitted.max(1) as f64;
    budget(
        "admissions from Redis away from the restarts",
        format!(
            "{:.3}% of {} ({} fallback admissions outside an outage)",
            share * 100.0,
            r.clean_admitted,
            r.fallback_outside
        ),
        "≥ 99.9%",
        share >= 0.999,
    );
    let mut back = restarts.back.clone();
    back.sort();
    let worst = back.last().copied().unwrap_or_default();
    budget(
        "every instance healthy on Redis after it answers again (median / worst)",
        format!(
            "{} / {}{}",
            secs(back.get(back.len() / 2).copied()),
            secs(back.last().copied()),
            if restarts.never_back > 0 {
                format!(", {} never", restarts.never_back)
            } else {
                String::new()
            }
        ),
        "≤ 3 s",
        restarts.never_back == 0 && worst <= Duration::from_secs(3),
    );
    let p99 = r.clean_latency.quantile(0.99);
    budget(
        "p50 / p99 latency away from the restarts",
        format!("{} / {}", ms(r.clean_latency.quantile(0.5)), ms(p99)),
        "p99 ≤ 20 ms",
        p99.is_some_and(|p| p <= Duration::from_millis(20)),
    );
    budget(
        "slowest request (restarts included)",
        ms(Some(r.all_latency.max)),
        "≤ 500 ms (the call timeout is 100 ms)",
        r.all_latency.max <= Duration::from_millis(500),
    );
    let baseline_at = restarts.first_over.unwrap_or(took.as_secs_f64() / 4.0);
    let baseline = samples
        .iter()
        .find(|s| s.0 >= baseline_at)
        .or(samples.last())
        .copied();
    let last = samples.last().copied();
    if let (Some(base), Some(last)) = (baseline, last) {
        let peak = samples
            .iter()
            .filter(|s| s.0 >= base.0)
            .map(|s| s.1)
            .max()
            .unwrap_or(base.1);
        let max_fds = samples
            .iter()
            .filter(|s| s.0 >= base.0)
            .map(|s| s.2)
            .max()
            .unwrap_or(base.2);
        let ratio = |kb: u64| kb as f64 / base.1.max(1) as f64;
        // The second half may grow by 5%, and by what the in-process stores may still
        // take until they reach their bound (an hour's run reaches it within its first
        // half; a short one does not): the documented most per key, 256 bytes.
        let half = samples
            .iter()
            .find(|s| s.0 >= took.as_secs_f64() / 2.0)
            .unwrap_or(&base);
        let late_growth = last.1 as f64 / half.1.max(1) as f64;
        let stores_kib = (MAX_LOCAL_KEYS * n * 256).div_ceil(1024);
        let late_budget = half.1 as f64 * 1.05 + stores_kib as f64;
        budget(
            "RSS: baseline (after the first restart), at the end, peak",
            format!(
                "{:.1} MiB, {:.1} MiB ({:.2}x), {:.1} MiB ({:.2}x)",
                base.1 as f64 / 1024.0,
                last.1 as f64 / 1024.0,
                ratio(last.1),
                peak as f64 / 1024.0,
                ratio(peak)
            ),
            "end ≤ 1.25x, peak ≤ 2x",
            ratio(last.1) <= 1.25 && ratio(peak) <= 2.0,
        );
        budget(
            "RSS over the run's second half",
            format!(
                "{:.1} to {:.1} MiB ({late_growth:.3}x)",
                half.1 as f64 / 1024.0,
                last.1 as f64 / 1024.0
            ),
            &format!(
                "≤ 1.05x + the stores' bound ({} KiB): ≤ {:.1} MiB",
                stores_kib,
                late_budget / 1024.0
            ),
            last.1 as f64 <= late_budget,
        );
        budget(
            "open file descriptors: baseline, at the end, most",
            format!("{}, {}, {max_fds}", base.2, last.2),
            "end ≤ baseline + 4, most ≤ baseline + 16",
            last.2 <= base.2 + 4 && max_fds <= base.2 + 16,
        );
    } else {
        budget("RSS and descriptors", "no sample".to_owned(), "", false);
    }
    // Keys in use: the hot keys of every route (the rolling window keeps two per key),
    // and the new keys of the last few seconds (the longest key lives 5 s).
    let churn_per_sec = if settings.churn == 0 {
        0.0
    } else {
        settings.rate / settings.churn as f64
    };
    let key_budget = (2.0 * (4 * HOT_KEYS) as f64 + 2.0 * churn_per_sec * 6.0 + 10.0) as u64;
    let most_keys = restarts.keys_before.iter().copied().max().unwrap_or(0);
    budget(
        "keys in Redis before a restart (most)",
        most_keys.to_string(),
        &format!("≤ {key_budget} (the keys of the last few seconds)"),
        most_keys <= key_budget,
    );
    let per = |count: u64| count as f64 / (cycles.max(1) as u64 * n) as f64;
    budget(
        "log lines per restart and instance: warn / info and above",
        format!("{:.1} / {:.1} ({warns} / {lines} in all)", per(warns), per(lines)),
        "warn ≤ 3, all ≤ 8 (by design 2 and 6: the breaker opens, the errors' summary; the subscription fails, a probe succeeds, the subscription is back, the recovery is over)",
        per(warns) <= 3.0 && per(lines) <= 8.0,
    );
    budget(
        "switches to the fallback per restart and instance",
        format!("{:.2} ({switches} in all)", per(switches)),
        "≤ 1",
        per(switches) <= 1.0,
    );
    (rows, ok)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "n/a".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "n/a".to_owned(),
        |d| format!("{:.1} ms", d.as_secs_f64() * 1e3),
    )
}
