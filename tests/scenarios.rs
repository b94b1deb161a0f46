//! One table of scenarios per algorithm, run against both of its hosts: the in-process
//! state machine (on a clock the test sets) and the Lua script on a real `redis-server`
//! whose wall clock the test freezes at each step (with the server's time, and with the
//! caller's time where the algorithm promises the same answers). Every host must give
//! the decision the table states: state, remaining units, reset and retry-after, to the
//! microsecond. A change to one host that the other lacks fails here.
//!
//! Times are milliseconds from [`T0`]; steps may go back in time (a stepped wall clock).

mod support;

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::time::Duration;

use support::{RedisServer, ServerClock};
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset, Weekday};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{ManualClock, TimeSource};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

use State::{Allowed, ExceedsCapacity, HitQuota, OverQuota};

/// 2027-01-15T08:00:00Z (16:00 in UTC+8), in milliseconds: a whole second, so that bucket
/// and window edges fall on the table's round numbers.
const T0_MS: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;

/// What a step does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Check,
    Peek,
    Refund,
    Reset,
    /// Blocks the key for `cost` milliseconds.
    Block,
    /// Lifts the key's block, its count kept.
    Unblock,
    /// Reserves `cost` units at most this many milliseconds ahead.
    Reserve(u64),
    /// Settles the key by this many units (spent past the limit, or given back).
    Settle(i64),
    /// A check of a priority class that may use this percentage of the limit.
    Priority(u32),
}

/// One operation (a check unless said otherwise): at `at` ms from [`T0_MS`], `cost`
/// units, and the answer every host gives.
#[derive(Debug, Clone, Copy)]
struct Step {
    op: Op,
    at: i64,
    cost: u32,
    state: State,
    remaining: u64,
    /// Reset, in microseconds.
    reset_us: u64,
    /// Retry-after, in microseconds.
    retry_us: Option<u64>,
}

/// A step in the tables' shorthand, reset and retry-after in milliseconds.
fn step(at: i64, cost: u32, state: State, remaining: u64, reset: u64, retry: Option<u64>) -> Step {
    step_us(
        at,
        cost,
        state,
        remaining,
        reset * 1_000,
        retry.map(|ms| ms * 1_000),
    )
}

/// A step whose reset and retry-after are in microseconds (rounded up by every host).
fn step_us(
    at: i64,
    cost: u32,
    state: State,
    remaining: u64,
    reset_us: u64,
    retry_us: Option<u64>,
) -> Step {
    Step {
        op: Op::Check,
        at,
        cost,
        state,
        remaining,
        reset_us,
        retry_us,
    }
}

/// `step` as another operation than a check.
fn with(op: Op, step: Step) -> Step {
    Step { op, ..step }
}

/// The part of a decision the hosts must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    state: State,
    remaining: u64,
    reset_us: u128,
    retry_us: Option<u128>,
}

impl Step {
    fn answer(&self) -> Answer {
        Answer {
            state: self.state,
            remaining: self.remaining,
            reset_us: u128::from(self.reset_us),
            retry_us: self.retry_us.map(u128::from),
        }
    }
}

/// Which hosts a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hosts {
    /// In-process, Redis with the server's time, Redis with the caller's time.
    All,
    /// Not the caller's time: the scenario steps the clock back, which that mode
    /// documents differently (a caller behind is not a step back of the shared clock).
    NoCallerTime,
}

struct Scenario {
    name: &'static str,
    limiter: fn(&Backend, &str) -> Box<dyn Limiter>,
    hosts: Hosts,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    InProcess,
    RedisServerTime,
    RedisCallerTime,
}

fn unix_us(at: i64) -> u64 {
    u64::try_from((T0_MS + at) * 1_000).expect("a time after 1970")
}

/// Runs `scenario` on `host`: one fresh key per run, every step at its time.
async fn run(
    scenario: &Scenario,
    host: Host,
    redis: &RedisServer,
    clock: &ServerClock,
) -> Vec<Answer> {
    let manual = ManualClock::new(unix_us(0));
    let builder = support::backend_builder()
        .manual_clock(manual.clone())
        .deny_cache(0)
        // The table is about decisions, not deadlines: a first call under load
        // (connecting, loading the engine) must not be answered by the fallback.
        .call_timeout(Duration::from_secs(10));
    let backend = match host {
        Host::InProcess => builder.build(),
        Host::RedisServerTime => builder
            .redis(redis.pool())
            .call_timeout(support::CALL_TIMEOUT)
            .build(),
        Host::RedisCallerTime => builder
            .redis(redis.pool())
            .call_timeout(support::CALL_TIMEOUT)
            .time_source(TimeSource::Caller)
            .build(),
    }
    .expect("backend");
    let name = format!("{}-{host:?}", scenario.name);
    let limiter = (scenario.limiter)(&backend, &name);
    let mut answers = Vec::new();
    for step in &scenario.steps {
        manual.set_us(unix_us(step.at));
        clock.freeze_at(i64::try_from(unix_us(step.at)).expect("fits"));
        let cost = NonZeroU32::new(step.cost).unwrap_or(NonZeroU32::MIN);
        let decision = match step.op {
            Op::Check => limiter.check(b"k", cost).await,
            Op::Priority(percent) => {
                let priority = f64::from(percent) / 100.0;
                limiter.check_priority(0, b"k", cost, priority).await
            }
            Op::Peek => limiter.peek(b"k", cost).expect("built-in").await,
            Op::Refund => limiter.refund(b"k", cost).expect("built-in").await,
            Op::Settle(delta) => limiter.settle(b"k", delta).expect("built-in").await,
            Op::Reset => limiter.reset(b"k").expect("built-in").await,
            Op::Unblock => limiter.unblock(b"k").expect("built-in").await,
            Op::Reserve(max_wait_ms) => {
                let max_wait = Duration::from_millis(max_wait_ms);
                limiter
                    .reserve(b"k", cost, max_wait)
                    .expect("a token bucket")
                    .await
            }
            Op::Block => {
                let duration = Duration::from_millis(u64::from(step.cost));
                limiter.block(b"k", duration).expect("built-in").await
            }
        };
        let expected_source = match host {
            Host::InProcess => Source::InProcess,
            Host::RedisServerTime | Host::RedisCallerTime => Source::Redis,
        };
        assert_eq!(
            decision.source, expected_source,
            "{}: {host:?} at {} ms answered from {:?}",
            scenario.name, step.at, decision.source
        );
        answers.push(Answer {
            state: decision.state,
            remaining: decision.remaining,
            reset_us: decision.reset.as_micros(),
            retry_us: decision.retry_after.map(|d: Duration| d.as_micros()),
        });
    }
    answers
}

/// Runs every scenario on every host it names; fails with one report of every
/// difference from the table.
async fn run_table(scenarios: &[Scenario]) {
    let (redis, clock) = RedisServer::start_with_clock();
    let mut report = String::new();
    for scenario in scenarios {
        let hosts: &[Host] = match scenario.hosts {
            Hosts::All => &[
                Host::InProcess,
                Host::RedisServerTime,
                Host::RedisCallerTime,
            ],
            Hosts::NoCallerTime => &[Host::InProcess, Host::RedisServerTime],
        };
        for &host in hosts {
            let answers = run(scenario, host, &redis, &clock).await;
            for (step, answer) in scenario.steps.iter().zip(&answers) {
                if *answer != step.answer() {
                    let _ = writeln!(
                        report,
                        "{} on {host:?}, {:?} at {} ms, cost {}:\n    expected {:?}\n    got      {answer:?}",
                        scenario.name,
                        step.op,
                        step.at,
                        step.cost,
                        step.answer()
                    );
                }
            }
        }
    }
    clock.set_offset_us(0);
    assert!(report.is_empty(), "hosts differ from the table:\n{report}");
}

const SEC: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Fixed window
// ---------------------------------------------------------------------------

fn period(quota: u64, period: Duration) -> impl Fn(&Backend, &str) -> Box<dyn Limiter> {
    move |backend, name| {
        Box::new(
            PeriodLimiter::new(backend, name, PeriodConfig::new(quota, period)).expect("valid"),
        )
    }
}

fn period_5_per_second(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    period(5, SEC)(backend, name)
}

fn period_2_per_second(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    period(2, SEC)(backend, name)
}

/// 2 per second, and a refusal locks the key out for 5 seconds.
fn period_2_per_second_lockout_5s(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = PeriodConfig::new(2, SEC).lockout(5 * SEC);
    Box::new(PeriodLimiter::new(backend, name, config).expect("valid"))
}

fn period_2_per_day_utc8(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = PeriodConfig::new(2, 86_400 * SEC).align(UtcOffset::from_hours(8));
    Box::new(PeriodLimiter::new(backend, name, config).expect("valid"))
}

#[tokio::test]
async fn fixed_window_hosts_agree() {
    let r = Some;
    run_table(&[
        Scenario {
            name: "go-zero states, then the next window",
            limiter: period_5_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 4, 1_000, None),
                step(0, 1, Allowed, 3, 1_000, None),
                step(0, 1, Allowed, 2, 1_000, None),
                step(0, 1, Allowed, 1, 1_000, None),
                step(0, 1, HitQuota, 0, 1_000, None),
                step(10, 1, OverQuota, 0, 990, r(990)),
                step(999, 1, OverQuota, 0, 1, r(1)),
                // The window ends exactly one period after it began.
                step(1_000, 1, Allowed, 4, 1_000, None),
            ],
        },
        Scenario {
            name: "peek, refund and reset",
            limiter: period_5_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(0, 3, Allowed, 2, 1_000, None),
                with(Op::Peek, step(10, 2, HitQuota, 0, 990, None)),
                with(Op::Peek, step(10, 3, OverQuota, 2, 990, r(990))),
                step(10, 1, Allowed, 1, 990, None),
                with(Op::Refund, step(20, 2, Allowed, 3, 980, None)),
                step(30, 3, HitQuota, 0, 970, None),
                // More than was spent: the window is emptied and forgotten.
                with(Op::Refund, step(40, 10, Allowed, 5, 1_000, None)),
                step(50, 1, Allowed, 4, 1_000, None),
                with(Op::Reset, step(60, 0, Allowed, 5, 1_000, None)),
                step(70, 5, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "settle down and up: debt until the window's end",
            limiter: period_5_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(0, 3, Allowed, 2, 1_000, None),
                with(Op::Settle(-1), step(10, 0, Allowed, 3, 990, None)),
                // 7 of 5: the key owes 2 until the window ends.
                with(Op::Settle(5), step(20, 0, OverQuota, 0, 980, r(980))),
                step(30, 1, OverQuota, 0, 970, r(970)),
                with(Op::Peek, step(40, 1, OverQuota, 0, 960, r(960))),
                // The debt ends with its window.
                step(1_000, 1, Allowed, 4, 1_000, None),
                with(Op::Settle(2), step(1_100, 0, Allowed, 2, 900, None)),
                // More back than was spent: the window is emptied and forgotten.
                with(Op::Settle(-10), step(1_200, 0, Allowed, 5, 1_000, None)),
                // A settlement on a key with no window starts one.
                with(Op::Settle(6), step(3_000, 0, OverQuota, 0, 1_000, r(1_000))),
                step(3_999, 1, OverQuota, 0, 1, r(1)),
                step(4_000, 5, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "a lockout after a refusal, a block, and a reset lifting it",
            limiter: period_2_per_second_lockout_5s,
            hosts: Hosts::All,
            steps: vec![
                step(0, 2, HitQuota, 0, 1_000, None),
                // Refused: locked out for 5 s from here.
                step(100, 1, OverQuota, 0, 5_000, r(5_000)),
                // The window has ended, the lock has not; nothing is spent.
                step(1_000, 1, OverQuota, 0, 4_100, r(4_100)),
                step(5_100, 1, Allowed, 1, 1_000, None),
                with(Op::Block, step(5_200, 300, OverQuota, 0, 900, r(300))),
                step(5_300, 1, OverQuota, 0, 800, r(200)),
                with(Op::Reset, step(5_400, 0, Allowed, 2, 1_000, None)),
                step(5_400, 1, Allowed, 1, 1_000, None),
            ],
        },
        Scenario {
            name: "a block and a lockout lifted by unblocks, the count kept",
            limiter: period_2_per_second_lockout_5s,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 1, 1_000, None),
                with(Op::Block, step(100, 300, OverQuota, 0, 900, r(300))),
                // Lifted: the one unit spent still counts.
                with(Op::Unblock, step(200, 0, Allowed, 1, 800, None)),
                step(200, 1, HitQuota, 0, 800, None),
                // Refused: locked out for 5 s from here.
                step(300, 1, OverQuota, 0, 5_000, r(5_000)),
                // Lifted once the window has ended: admitted at once, not at 5 300.
                with(Op::Unblock, step(1_000, 0, Allowed, 2, 1_000, None)),
                step(1_000, 1, Allowed, 1, 1_000, None),
            ],
        },
        Scenario {
            // Shrunk from `tests/model.rs`: the hosts answered a blocked key differently,
            // and its `Retry-After` was the block's even where the limit refused longer.
            name: "a blocked key says the limit's own wait when it is longer",
            limiter: period_2_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(0, 2, HitQuota, 0, 1_000, None),
                with(Op::Block, step(0, 200, OverQuota, 0, 1_000, r(200))),
                // Blocked, and the window is full until 1 000: retry then, not at 200.
                step(100, 1, OverQuota, 0, 900, r(900)),
                with(Op::Peek, step(100, 1, OverQuota, 0, 900, r(900))),
                // The window emptied: the limit would admit, the block's wait stands.
                with(Op::Refund, step(150, 2, OverQuota, 0, 1_000, r(50))),
                step(160, 1, OverQuota, 0, 1_000, r(40)),
                step(200, 1, Allowed, 1, 1_000, None),
            ],
        },
        Scenario {
            name: "a window starts at its first request",
            limiter: period_5_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(500, 1, Allowed, 4, 1_000, None),
                step(1_400, 1, Allowed, 3, 100, None),
                step(1_500, 1, Allowed, 4, 1_000, None),
            ],
        },
        Scenario {
            name: "refused costs are not counted",
            limiter: period_5_per_second,
            hosts: Hosts::All,
            steps: vec![
                step(0, 3, Allowed, 2, 1_000, None),
                step(1, 3, OverQuota, 2, 999, r(999)),
                step(2, 2, HitQuota, 0, 998, None),
                step(3, 6, ExceedsCapacity, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "aligned to local midnight in UTC+8",
            limiter: period_2_per_day_utc8,
            hosts: Hosts::All,
            steps: vec![
                // 23:59:59.000 local time.
                step(8 * HOUR - 1_000, 1, Allowed, 1, 1_000, None),
                step(8 * HOUR - 500, 1, HitQuota, 0, 500, None),
                step(8 * HOUR - 1, 1, OverQuota, 0, 1, r(1)),
                step(8 * HOUR, 1, Allowed, 1, 86_400_000, None),
            ],
        },
        Scenario {
            name: "a clock step back keeps the count for at most a period",
            limiter: period_2_per_second,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 1, Allowed, 1, 1_000, None),
                step(0, 1, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                step(-HOUR + 999, 1, OverQuota, 0, 1, r(1)),
                step(-HOUR + 1_000, 1, Allowed, 1, 1_000, None),
            ],
        },
        Scenario {
            name: "a clock step back, then back again: the window is as the key left it",
            limiter: period_2_per_second,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 2, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                // The refused check behind did not end the window early.
                step(50, 1, OverQuota, 0, 950, r(950)),
                step(1_000, 1, Allowed, 1, 1_000, None),
            ],
        },
        Scenario {
            name: "a window opened while the clock is behind survives its return",
            limiter: period_2_per_second,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 2, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                // The key's time runs on: its next window starts one period later.
                step(-HOUR + 1_000, 1, Allowed, 1, 1_000, None),
                step(1_500, 1, HitQuota, 0, 500, None),
                step(1_600, 1, OverQuota, 0, 400, r(400)),
            ],
        },
        Scenario {
            name: "a clock step forward ends the window",
            limiter: period_2_per_second,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 2, HitQuota, 0, 1_000, None),
                step(HOUR, 1, Allowed, 1, 1_000, None),
            ],
        },
    ])
    .await;
}

// ---------------------------------------------------------------------------
// Token bucket
// ---------------------------------------------------------------------------

/// 10 tokens per second (one per 100 ms), burst 5.
fn bucket_10_per_second_burst_5(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = TokenBucketConfig::new(10, SEC, 5);
    Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid"))
}

/// 3 tokens per second (333.333 ms each), burst 2.
fn bucket_3_per_second_burst_2(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = TokenBucketConfig::new(3, SEC, 2);
    Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid"))
}

/// 3 tokens per 2 seconds (666.667 ms each), burst 3.
fn bucket_3_per_2s_burst_3(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = TokenBucketConfig::new(3, 2 * SEC, 3);
    Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid"))
}

/// 7 tokens per 3 seconds (428.571 ms each), burst 7.
fn bucket_7_per_3s_burst_7(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = TokenBucketConfig::new(7, 3 * SEC, 7);
    Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid"))
}

/// 1 token per 3 seconds, burst 10.
fn bucket_1_per_3s_burst_10(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = TokenBucketConfig::new(1, 3 * SEC, 10);
    Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid"))
}

#[tokio::test]
async fn token_bucket_hosts_agree() {
    let r = Some;
    run_table(&[
        Scenario {
            name: "a full bucket, then the refill rate",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 4, 100, None),
                step(0, 1, Allowed, 3, 200, None),
                step(0, 1, Allowed, 2, 300, None),
                step(0, 1, Allowed, 1, 400, None),
                step(0, 1, HitQuota, 0, 500, None),
                step(30, 1, OverQuota, 0, 470, r(70)),
                step(100, 1, HitQuota, 0, 500, None),
                // Weighted: 3 tokens are back 300 ms later, not 4.
                step(400, 4, OverQuota, 3, 200, r(100)),
                step(500, 4, HitQuota, 0, 500, None),
                step(500, 6, ExceedsCapacity, 0, 0, None),
                // Idle for long: full again, never more.
                step(HOUR, 5, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "peek, refund, reset and block",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::All,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                with(Op::Peek, step(0, 1, OverQuota, 0, 500, r(100))),
                with(Op::Refund, step(0, 2, Allowed, 2, 300, None)),
                step(0, 2, HitQuota, 0, 500, None),
                // More than was taken: full, never beyond.
                with(Op::Refund, step(100, 10, Allowed, 5, 0, None)),
                step(100, 1, Allowed, 4, 100, None),
                with(Op::Reset, step(200, 0, Allowed, 5, 0, None)),
                with(Op::Peek, step(200, 6, ExceedsCapacity, 0, 0, None)),
                with(Op::Block, step(300, 250, OverQuota, 0, 250, r(250))),
                step(400, 1, OverQuota, 0, 150, r(150)),
                step(550, 1, Allowed, 4, 100, None),
            ],
        },
        Scenario {
            // Not the callers' clocks: a caller reads a TAT beyond an empty bucket as an
            // empty bucket (as it does a reservation's), so its debt is at most a refill.
            name: "settle down and up: debt until the refill pays it off",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 3, Allowed, 2, 300, None),
                with(Op::Settle(-1), step(0, 0, Allowed, 3, 200, None)),
                // 6 more: the TAT is 300 ms beyond an empty bucket.
                with(Op::Settle(6), step(0, 0, OverQuota, 0, 800, r(300))),
                step(100, 1, OverQuota, 0, 700, r(300)),
                // Paid off at 300 ms; a token is back at 400 ms.
                with(Op::Settle(0), step(300, 0, HitQuota, 0, 500, None)),
                with(Op::Peek, step(300, 1, OverQuota, 0, 500, r(100))),
                step(400, 1, HitQuota, 0, 500, None),
                // More back than was taken: full, never beyond.
                with(Op::Settle(-20), step(400, 0, Allowed, 5, 0, None)),
                // A settlement on a full bucket.
                with(Op::Settle(7), step(HOUR, 0, OverQuota, 0, 700, r(200))),
                step(HOUR + 300, 1, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "reservations",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::All,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                // Two tokens, 200 ms from now: taken now, used then.
                with(Op::Reserve(300), step(0, 2, HitQuota, 0, 700, r(200))),
                // Two more would be 400 ms away: past the maximum, nothing taken.
                with(Op::Reserve(300), step(0, 2, OverQuota, 0, 700, r(400))),
                step(250, 1, OverQuota, 0, 450, r(50)),
                with(Op::Reserve(1_000), step(300, 1, HitQuota, 0, 500, None)),
                with(
                    Op::Reserve(1_000),
                    step(300, 6, ExceedsCapacity, 0, 0, None),
                ),
            ],
        },
        Scenario {
            // Shrunk from `tests/model.rs`: a check or peek after a reservation read the
            // bucket as merely empty and said to retry before the reserved tokens' time.
            // (With callers' clocks such a TAT may be a caller ahead: not this rule.)
            name: "tokens reserved beyond the burst count for the checks after them",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                with(Op::Reserve(300), step(0, 2, HitQuota, 0, 700, r(200))),
                step(0, 1, OverQuota, 0, 700, r(300)),
                with(Op::Peek, step(100, 1, OverQuota, 0, 600, r(200))),
                step(300, 1, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "fractional intervals",
            limiter: bucket_3_per_second_burst_2,
            hosts: Hosts::All,
            steps: vec![
                // Two tokens take 666_666.67 µs; durations are rounded up to the µs.
                step_us(0, 2, HitQuota, 0, 666_667, None),
                step_us(300, 1, OverQuota, 0, 366_667, r(33_334)),
                step_us(334, 1, HitQuota, 0, 666_000, None),
            ],
        },
        Scenario {
            name: "remaining at a fractional rate: 3 per 2 s",
            limiter: bucket_3_per_2s_burst_3,
            hosts: Hosts::All,
            steps: vec![
                step_us(0, 1, Allowed, 2, 666_667, None),
                step_us(0, 1, Allowed, 1, 1_333_334, None),
                step_us(0, 1, HitQuota, 0, 2_000_000, None),
                step_us(1_000, 1, HitQuota, 0, 1_666_667, None),
                step_us(3_000, 2, Allowed, 1, 1_333_334, None),
                with(Op::Peek, step_us(3_000, 1, HitQuota, 0, 2_000_000, None)),
                with(Op::Refund, step_us(3_000, 1, Allowed, 2, 666_667, None)),
                with(
                    Op::Reserve(1_000),
                    step_us(3_000, 3, HitQuota, 0, 2_666_667, r(666_667)),
                ),
            ],
        },
        Scenario {
            name: "remaining at a fractional rate: 7 per 3 s",
            limiter: bucket_7_per_3s_burst_7,
            hosts: Hosts::All,
            steps: vec![
                step_us(0, 1, Allowed, 6, 428_572, None),
                step_us(0, 2, Allowed, 4, 1_285_715, None),
                step_us(0, 4, HitQuota, 0, 3_000_000, None),
                step_us(0, 1, OverQuota, 0, 3_000_000, r(428_572)),
                step_us(3_000, 7, HitQuota, 0, 3_000_000, None),
            ],
        },
        Scenario {
            name: "remaining at a slow rate: 1 per 3 s, burst 10",
            limiter: bucket_1_per_3s_burst_10,
            hosts: Hosts::All,
            steps: vec![
                step_us(0, 4, Allowed, 6, 12_000_000, None),
                step_us(0, 6, HitQuota, 0, 30_000_000, None),
                step_us(6_000, 2, HitQuota, 0, 30_000_000, None),
            ],
        },
        Scenario {
            name: "a clock step back blocks a key for at most a refill",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                step(-HOUR, 1, OverQuota, 0, 500, r(100)),
                step(-HOUR + 100, 1, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "a clock step back, then back again: nothing more",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                step(-HOUR, 1, OverQuota, 0, 500, r(100)),
                // Half a token since the burst: the refused check behind refilled nothing.
                step(50, 1, OverQuota, 0, 450, r(50)),
                step(100, 1, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "tokens taken while the clock is behind still count on its return",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                step(-HOUR, 1, OverQuota, 0, 500, r(100)),
                step(-HOUR + 100, 1, HitQuota, 0, 500, None),
                // Back at 150 ms: the bucket as the key left it (its time was 100 ms).
                step(150, 1, OverQuota, 0, 450, r(50)),
                step(200, 1, HitQuota, 0, 500, None),
            ],
        },
        Scenario {
            name: "a clock step forward refills early, never beyond full",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 500, None),
                step(HOUR, 5, HitQuota, 0, 500, None),
            ],
        },
    ])
    .await;
}

// ---------------------------------------------------------------------------
// Rolling window
// ---------------------------------------------------------------------------

/// At most 5 units in any 10 buckets of 100 ms.
fn rolling_5_per_10x100ms(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = RollingConfig::new(5, 10, Duration::from_millis(100));
    Box::new(RollingWindowLimiter::new(backend, name, config).expect("valid"))
}

#[tokio::test]
async fn rolling_window_hosts_agree() {
    let r = Some;
    run_table(&[
        Scenario {
            name: "buckets expire one at a time",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 4, 1_000, None),
                step(50, 2, Allowed, 2, 950, None),
                step(250, 2, HitQuota, 0, 950, None),
                // The oldest bucket (3 units) goes at 1000 ms.
                step(300, 1, OverQuota, 0, 900, r(700)),
                step(1_000, 3, HitQuota, 0, 1_000, None),
                // Two units in the bucket of 200 ms go at 1200 ms.
                step(1_100, 1, OverQuota, 0, 900, r(100)),
                step(1_200, 2, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "peek, refund (newest buckets first), reset and block",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::All,
            steps: vec![
                step(0, 2, Allowed, 3, 1_000, None),
                step(150, 2, Allowed, 1, 950, None),
                with(Op::Peek, step(150, 2, OverQuota, 1, 950, r(850))),
                // Two units off the bucket of 100 ms, one off the bucket of 0 ms.
                with(Op::Refund, step(200, 3, Allowed, 4, 1_000, None)),
                step(200, 4, HitQuota, 0, 1_000, None),
                // The unit left in the first bucket goes at 1000 ms.
                step(210, 1, OverQuota, 0, 990, r(790)),
                with(Op::Reset, step(300, 0, Allowed, 5, 1_000, None)),
                step(300, 5, HitQuota, 0, 1_000, None),
                with(Op::Block, step(400, 2_000, OverQuota, 0, 2_000, r(2_000))),
                // The units have expired; the block has not.
                step(1_500, 1, OverQuota, 0, 1_000, r(900)),
                step(2_400, 1, Allowed, 4, 1_000, None),
            ],
        },
        Scenario {
            name: "settle down and up: debt until the oldest buckets expire",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::All,
            steps: vec![
                step(0, 2, Allowed, 3, 1_000, None),
                // 4 more in the bucket of 100 ms: 6 of 5 until the bucket of 0 ms goes.
                with(Op::Settle(4), step(150, 0, OverQuota, 0, 950, r(850))),
                step(200, 1, OverQuota, 0, 900, r(800)),
                // 3 back, off the newest bucket.
                with(Op::Settle(-3), step(300, 0, Allowed, 2, 1_000, None)),
                // 9 in the bucket of 1000 ms (the one of 0 ms has gone): 10 of 5.
                with(Op::Settle(9), step(1_000, 0, OverQuota, 0, 1_000, r(1_000))),
                step(1_100, 1, OverQuota, 0, 900, r(900)),
                step(2_000, 5, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "refused costs are not counted",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::All,
            steps: vec![
                step(0, 3, Allowed, 2, 1_000, None),
                step(100, 3, OverQuota, 2, 900, r(900)),
                step(100, 2, HitQuota, 0, 1_000, None),
                step(100, 6, ExceedsCapacity, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "a clock step back moves the buckets back with it",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                step(-HOUR + 1_000, 1, Allowed, 4, 1_000, None),
            ],
        },
        Scenario {
            name: "a clock step back, then back again: the buckets are as the key left them",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                step(50, 1, OverQuota, 0, 950, r(950)),
                step(1_000, 1, Allowed, 4, 1_000, None),
            ],
        },
        Scenario {
            name: "units counted while the clock is behind still count on its return",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 1_000, None),
                step(-HOUR, 1, OverQuota, 0, 1_000, r(1_000)),
                // The key's time runs on from its newest bucket: at 1000 ms its units go.
                step(-HOUR + 1_000, 4, Allowed, 1, 1_000, None),
                step(1_050, 2, OverQuota, 1, 950, r(950)),
                step(1_050, 1, HitQuota, 0, 950, None),
            ],
        },
        Scenario {
            name: "a clock step forward expires every bucket",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 5, HitQuota, 0, 1_000, None),
                step(HOUR, 1, Allowed, 4, 1_000, None),
            ],
        },
    ])
    .await;
}

// ---------------------------------------------------------------------------
// Sets of limits, all or nothing
// ---------------------------------------------------------------------------

/// 2 per second and 3 per day, both fixed windows.
fn set_2_per_second_3_per_day(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .limit("burst", PeriodConfig::new(2, SEC))
        .limit("daily", PeriodConfig::new(3, 86_400 * SEC));
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// A token bucket (10 per second, burst 2) and a rolling window (3 in 10 x 100 ms).
fn set_bucket_and_rolling(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .limit("bucket", TokenBucketConfig::new(10, SEC, 2))
        .limit(
            "rolling",
            RollingConfig::new(3, 10, Duration::from_millis(100)),
        );
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// 3 requests per second, whatever their cost, and 10 units per second: the pair LLM
/// APIs publish (requests and tokens per minute), scaled down.
fn set_requests_and_tokens(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .requests("rpm", PeriodConfig::new(3, SEC))
        .limit("tpm", PeriodConfig::new(10, SEC));
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// 3 requests per second as a token bucket (burst 3), whatever their cost, and 10 units
/// per second: the LLM pair as `benches/bench_engine.rs` runs it.
fn set_requests_bucket_and_tokens(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .requests("rpm", TokenBucketConfig::new(3, SEC, 3))
        .limit("tpm", PeriodConfig::new(10, SEC));
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// A fixed window (5 per second) before a rolling window (3 in 10 x 100 ms): a
/// settlement the window counts and the rolling window leaves to the general engine
/// (a charge past its limit, a refund that leaves it in debt).
fn set_window_then_rolling(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .limit("window", PeriodConfig::new(5, SEC))
        .limit(
            "rolling",
            RollingConfig::new(3, 10, Duration::from_millis(100)),
        );
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// A set's decision is the admitting limit with the least left, or the refusing limit
/// with the longest wait; a refusal by any limit spends none of them.
#[tokio::test]
async fn limit_set_hosts_agree() {
    let r = Some;
    const DAY: u64 = 86_400_000;
    run_table(&[
        Scenario {
            name: "a refusal by one limit spends none",
            limiter: set_2_per_second_3_per_day,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 1, 1_000, None),
                step(0, 1, HitQuota, 0, 1_000, None),
                // The burst refuses: the daily quota is not spent...
                step(0, 1, OverQuota, 0, 1_000, r(1_000)),
                // ...so its third unit is still there a second later.
                step(1_000, 1, HitQuota, 0, DAY - 1_000, None),
                // The daily quota refuses: the burst is not spent either.
                step(2_000, 1, OverQuota, 0, DAY - 2_000, r(DAY - 2_000)),
                step(2_000, 3, ExceedsCapacity, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "a refund and a reset reach every limit",
            limiter: set_2_per_second_3_per_day,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 1, 1_000, None),
                with(Op::Refund, step(10, 1, Allowed, 2, 1_000, None)),
                step(20, 2, HitQuota, 0, 1_000, None),
                with(Op::Peek, step(20, 1, OverQuota, 0, 1_000, r(1_000))),
                with(Op::Reset, step(30, 0, Allowed, 2, 1_000, None)),
                step(30, 2, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "requests and tokens: a settlement reaches the tokens only",
            limiter: set_requests_and_tokens,
            hosts: Hosts::All,
            steps: vec![
                // One request of the 3, 4 tokens of the 10.
                step(0, 4, Allowed, 2, 1_000, None),
                // 12 tokens of 10: the key owes 2 until the window ends.
                with(Op::Settle(8), step(10, 0, OverQuota, 0, 990, r(990))),
                step(20, 1, OverQuota, 0, 980, r(980)),
                step(1_000, 5, Allowed, 2, 1_000, None),
                with(Op::Settle(-5), step(1_010, 0, Allowed, 2, 990, None)),
                step(1_020, 9, Allowed, 1, 980, None),
                // The tokens refuse: the request is not counted either.
                step(1_030, 2, OverQuota, 1, 990, r(990)),
                step(1_040, 1, HitQuota, 0, 960, None),
                step(1_050, 1, OverQuota, 0, 970, r(970)),
            ],
        },
        Scenario {
            name: "a settlement reaches every limit that counts cost",
            limiter: set_bucket_and_rolling,
            hosts: Hosts::NoCallerTime,
            steps: vec![
                step(0, 1, Allowed, 1, 100, None),
                // 2 more: the bucket owes one token (100 ms); the rolling window is
                // full (3 of 3).
                with(Op::Settle(2), step(0, 0, OverQuota, 0, 300, r(100))),
                with(Op::Settle(-1), step(0, 0, HitQuota, 0, 200, None)),
                step(0, 1, OverQuota, 0, 200, r(100)),
                step(1_000, 2, HitQuota, 0, 200, None),
            ],
        },
        Scenario {
            name: "requests as a token bucket: a settlement reads it and reaches the tokens",
            limiter: set_requests_bucket_and_tokens,
            hosts: Hosts::All,
            steps: vec![
                // One request of the 3 (full again in 333 334 µs), 4 tokens of the 10.
                step_us(0, 4, Allowed, 2, 333_334, None),
                // 12 tokens of 10: the key owes 2 until the window ends.
                with(Op::Settle(8), step(10, 0, OverQuota, 0, 990, r(990))),
                // 7 of 10: the requests' 2 left are the least.
                with(Op::Settle(-5), step_us(20, 0, Allowed, 2, 313_334, None)),
                step(30, 3, HitQuota, 0, 970, None),
                with(Op::Settle(-2), step_us(40, 0, Allowed, 1, 626_667, None)),
            ],
        },
        Scenario {
            name: "a settlement a later limit leaves to the engine is counted once",
            limiter: set_window_then_rolling,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 2, 1_000, None),
                // The rolling window cannot take 4 more (5 of 3): the window's count is
                // taken back, and the engine charges both.
                with(Op::Settle(4), step(10, 0, OverQuota, 0, 990, r(990))),
                // The rolling window stays in debt (4 of 3): taken back again.
                with(Op::Settle(-1), step(20, 0, OverQuota, 0, 980, r(980))),
                // 2 of 5 and 2 of 3.
                with(Op::Settle(-2), step(30, 0, Allowed, 1, 970, None)),
                step(40, 1, HitQuota, 0, 960, None),
                step(50, 1, OverQuota, 0, 950, r(950)),
                // 7 of 5 and 7 of 3: the rolling window owes until its last bucket
                // (4 units) ends at 1 900 ms.
                with(Op::Settle(4), step(950, 0, OverQuota, 0, 950, r(950))),
                // A window that this settlement starts, taken back (the rolling window
                // cannot take it: 6 of 3), then started by the engine: 2 of 5.
                with(Op::Settle(2), step(1_000, 0, OverQuota, 0, 1_000, r(900))),
                // 1 of 5; the rolling window still owes (5 of 3).
                with(Op::Settle(-1), step(1_010, 0, OverQuota, 0, 990, r(890))),
                // 3 of 5 and 3 of 3.
                step(1_900, 2, HitQuota, 0, 1_000, None),
            ],
        },
        Scenario {
            name: "mixed algorithms",
            limiter: set_bucket_and_rolling,
            hosts: Hosts::All,
            steps: vec![
                step(0, 1, Allowed, 1, 100, None),
                step(0, 1, HitQuota, 0, 200, None),
                step(0, 1, OverQuota, 0, 200, r(100)),
                step(100, 1, HitQuota, 0, 200, None),
                // The rolling window is full until its first bucket ends (1000 ms).
                step(300, 1, OverQuota, 0, 800, r(700)),
                step(1_000, 2, HitQuota, 0, 200, None),
            ],
        },
    ])
    .await;
}

// ---------------------------------------------------------------------------
// Calendar windows (fixed windows in an IANA time zone)
// ---------------------------------------------------------------------------

/// `rfc3339` (with its offset written out, so that no zone rule is needed to read it) as
/// a step's time: milliseconds from [`T0_MS`].
fn at(rfc3339: &str) -> i64 {
    let ts: jiff::Timestamp = rfc3339.parse().expect("an RFC 3339 time");
    ts.as_millisecond() - T0_MS
}

/// A limiter of `quota` per window of `calendar`.
fn calendar(quota: u64, calendar: Calendar, backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let config = PeriodConfig::calendar(quota, calendar);
    Box::new(PeriodLimiter::new(backend, name, config).expect("valid"))
}

fn day_new_york(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(2, Calendar::day("America/New_York"), backend, name)
}

fn day_shanghai(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(1, Calendar::day("Asia/Shanghai"), backend, name)
}

fn day_kolkata(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(2, Calendar::day("Asia/Kolkata"), backend, name)
}

fn day_santiago(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(2, Calendar::day("America/Santiago"), backend, name)
}

fn month_utc(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(1, Calendar::month("UTC"), backend, name)
}

fn month_from_31st_utc(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(1, Calendar::month_from_day("UTC", 31), backend, name)
}

fn month_from_15th_new_york(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(
        1,
        Calendar::month_from_day("America/New_York", 15),
        backend,
        name,
    )
}

fn month_shanghai(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(1, Calendar::month("Asia/Shanghai"), backend, name)
}

fn week_berlin_monday(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(
        1,
        Calendar::week("Europe/Berlin", Weekday::Monday),
        backend,
        name,
    )
}

fn week_new_york_sunday(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    calendar(
        1,
        Calendar::week("America/New_York", Weekday::Sunday),
        backend,
        name,
    )
}

/// 2 per local day in New York and 3 per calendar month in UTC, all or nothing.
fn set_day_new_york_month_utc(backend: &Backend, name: &str) -> Box<dyn Limiter> {
    let set = LimitSet::new()
        .limit(
            "daily",
            PeriodConfig::calendar(2, Calendar::day("America/New_York")),
        )
        .limit("monthly", PeriodConfig::calendar(3, Calendar::month("UTC")));
    Box::new(SetLimiter::new(backend, name, set).expect("valid"))
}

/// Windows from local midnight to local midnight in the zone, however long the day, week
/// or month: on the in-process host and on Redis (the server's clock frozen at each step,
/// and the caller's clock), each `Retry-After` and reset counting to the true end.
#[tokio::test]
async fn calendar_window_hosts_agree() {
    let r = Some;
    const H: u64 = 3_600_000;
    const DAY: u64 = 24 * H;
    run_table(&[
        Scenario {
            name: "a settlement on a 23-hour day owes until its true end",
            limiter: day_new_york,
            hosts: Hosts::All,
            steps: vec![
                step(at("2026-03-08T12:00:00-04:00"), 1, Allowed, 1, 12 * H, None),
                // 4 of 2: owed until local midnight, 12 hours on.
                with(
                    Op::Settle(3),
                    step(
                        at("2026-03-08T12:00:00-04:00"),
                        0,
                        OverQuota,
                        0,
                        12 * H,
                        r(12 * H),
                    ),
                ),
                step(
                    at("2026-03-08T23:59:59.999-04:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(at("2026-03-09T00:00:00-04:00"), 1, Allowed, 1, DAY, None),
                with(
                    Op::Settle(-1),
                    step(at("2026-03-09T00:00:00-04:00"), 0, Allowed, 2, DAY, None),
                ),
                // A settlement on a key with no window opens the day's.
                with(
                    Op::Settle(5),
                    step(
                        at("2026-03-09T06:00:00-04:00"),
                        0,
                        OverQuota,
                        0,
                        18 * H,
                        r(18 * H),
                    ),
                ),
            ],
        },
        Scenario {
            name: "New York's spring day lasts 23 hours",
            limiter: day_new_york,
            hosts: Hosts::All,
            steps: vec![
                step(at("2026-03-07T23:59:59.999-05:00"), 1, Allowed, 1, 1, None),
                step(at("2026-03-08T00:00:00-05:00"), 1, Allowed, 1, 23 * H, None),
                // 12:00 EDT: 12 hours left, not 11 (UTC-5) nor 13.
                step(
                    at("2026-03-08T12:00:00-04:00"),
                    1,
                    HitQuota,
                    0,
                    12 * H,
                    None,
                ),
                step(
                    at("2026-03-08T23:59:59.999-04:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(at("2026-03-09T00:00:00-04:00"), 1, Allowed, 1, DAY, None),
            ],
        },
        Scenario {
            name: "New York's autumn day lasts 25 hours",
            limiter: day_new_york,
            hosts: Hosts::All,
            steps: vec![
                step(at("2026-10-31T23:59:59.999-04:00"), 1, Allowed, 1, 1, None),
                step(at("2026-11-01T00:00:00-04:00"), 1, Allowed, 1, 25 * H, None),
                // The second 01:30 (EST), 2.5 hours into the day.
                step(
                    at("2026-11-01T01:30:00-05:00"),
                    1,
                    HitQuota,
                    0,
                    22 * H + H / 2,
                    None,
                ),
                step(
                    at("2026-11-01T23:59:59.999-05:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(at("2026-11-02T00:00:00-05:00"), 1, Allowed, 1, DAY, None),
            ],
        },
        Scenario {
            name: "a zone without daylight saving time (Asia/Shanghai)",
            limiter: day_shanghai,
            hosts: Hosts::All,
            steps: vec![
                step(at("2027-01-15T23:59:59.999+08:00"), 1, HitQuota, 0, 1, None),
                step(at("2027-01-16T00:00:00+08:00"), 1, HitQuota, 0, DAY, None),
                step(
                    at("2027-01-16T12:00:00+08:00"),
                    1,
                    OverQuota,
                    0,
                    12 * H,
                    r(12 * H),
                ),
            ],
        },
        Scenario {
            name: "a half-hour zone (Asia/Kolkata)",
            limiter: day_kolkata,
            hosts: Hosts::All,
            steps: vec![
                step(at("2027-01-15T23:59:59.999+05:30"), 1, Allowed, 1, 1, None),
                step(at("2027-01-16T00:00:00+05:30"), 1, Allowed, 1, DAY, None),
                // Midnight UTC is 05:30 local: 18.5 hours left.
                step(
                    at("2027-01-16T00:00:00Z"),
                    1,
                    HitQuota,
                    0,
                    18 * H + H / 2,
                    None,
                ),
            ],
        },
        Scenario {
            name: "daylight saving time starting at midnight (America/Santiago)",
            limiter: day_santiago,
            hosts: Hosts::All,
            steps: vec![
                step(at("2026-09-05T23:59:59.999-04:00"), 1, Allowed, 1, 1, None),
                // Midnight does not exist on 2026-09-06: the day starts at 01:00 -03.
                step(at("2026-09-06T01:00:00-03:00"), 1, Allowed, 1, 23 * H, None),
                step(at("2026-09-06T23:59:59.999-03:00"), 1, HitQuota, 0, 1, None),
                step(at("2026-09-07T00:00:00-03:00"), 1, Allowed, 1, DAY, None),
            ],
        },
        Scenario {
            name: "months of 28, 31 and 30 days, and a leap February",
            limiter: month_utc,
            hosts: Hosts::All,
            steps: vec![
                step(at("2027-02-01T00:00:00Z"), 1, HitQuota, 0, 28 * DAY, None),
                step(at("2027-02-28T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2027-03-01T00:00:00Z"), 1, HitQuota, 0, 31 * DAY, None),
                step(at("2027-03-31T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2027-04-01T00:00:00Z"), 1, HitQuota, 0, 30 * DAY, None),
                step(at("2027-04-30T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2028-02-01T00:00:00Z"), 1, HitQuota, 0, 29 * DAY, None),
                step(at("2028-02-29T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2028-03-01T00:00:00Z"), 1, HitQuota, 0, 31 * DAY, None),
            ],
        },
        Scenario {
            name: "months from the 31st: February clamped in a common and a leap year",
            limiter: month_from_31st_utc,
            hosts: Hosts::All,
            steps: vec![
                step(at("2027-01-31T00:00:00Z"), 1, HitQuota, 0, 28 * DAY, None),
                step(at("2027-02-27T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2027-02-28T00:00:00Z"), 1, HitQuota, 0, 31 * DAY, None),
                step(at("2027-03-30T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2027-03-31T00:00:00Z"), 1, HitQuota, 0, 30 * DAY, None),
                step(at("2028-01-31T00:00:00Z"), 1, HitQuota, 0, 29 * DAY, None),
                step(at("2028-02-28T23:59:59.999Z"), 1, OverQuota, 0, 1, r(1)),
                step(at("2028-02-29T00:00:00Z"), 1, HitQuota, 0, 31 * DAY, None),
            ],
        },
        Scenario {
            name: "months from the 15th in New York, across the change to daylight time",
            limiter: month_from_15th_new_york,
            hosts: Hosts::All,
            steps: vec![
                // February 15th to March 15th holds March 8th: an hour short.
                step(
                    at("2026-02-15T00:00:00-05:00"),
                    1,
                    HitQuota,
                    0,
                    28 * DAY - H,
                    None,
                ),
                step(
                    at("2026-03-14T23:59:59.999-04:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(
                    at("2026-03-15T00:00:00-04:00"),
                    1,
                    HitQuota,
                    0,
                    31 * DAY,
                    None,
                ),
            ],
        },
        Scenario {
            name: "a leap February in Asia/Shanghai",
            limiter: month_shanghai,
            hosts: Hosts::All,
            steps: vec![
                step(
                    at("2028-02-10T00:00:00+08:00"),
                    1,
                    HitQuota,
                    0,
                    20 * DAY,
                    None,
                ),
                step(
                    at("2028-02-29T23:59:59.999+08:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(
                    at("2028-03-01T00:00:00+08:00"),
                    1,
                    HitQuota,
                    0,
                    31 * DAY,
                    None,
                ),
            ],
        },
        Scenario {
            name: "weeks starting Monday (Europe/Berlin)",
            limiter: week_berlin_monday,
            hosts: Hosts::All,
            steps: vec![
                // The week of the autumn change: 7 days and an hour.
                step(
                    at("2026-10-19T00:00:00+02:00"),
                    1,
                    HitQuota,
                    0,
                    7 * DAY + H,
                    None,
                ),
                step(
                    at("2026-10-25T23:59:59.999+01:00"),
                    1,
                    OverQuota,
                    0,
                    1,
                    r(1),
                ),
                step(
                    at("2026-10-26T00:00:00+01:00"),
                    1,
                    HitQuota,
                    0,
                    7 * DAY,
                    None,
                ),
                // Sunday 2027-01-17, then Monday.
                step(at("2027-01-17T23:59:59.999+01:00"), 1, HitQuota, 0, 1, None),
                step(
                    at("2027-01-18T00:00:00+01:00"),
                    1,
                    HitQuota,
                    0,
                    7 * DAY,
                    None,
                ),
            ],
        },
        Scenario {
            name: "weeks starting Sunday (America/New_York)",
            limiter: week_new_york_sunday,
            hosts: Hosts::All,
            steps: vec![
                // Saturday 2027-01-16, then Sunday, then Monday (not an edge).
                step(at("2027-01-16T23:59:59.999-05:00"), 1, HitQuota, 0, 1, None),
                step(
                    at("2027-01-17T00:00:00-05:00"),
                    1,
                    HitQuota,
                    0,
                    7 * DAY,
                    None,
                ),
                step(
                    at("2027-01-18T00:00:00-05:00"),
                    1,
                    OverQuota,
                    0,
                    6 * DAY,
                    r(6 * DAY),
                ),
            ],
        },
    ])
    .await;
}

/// A set mixing a day in a zone with a calendar month: a refusal by either spends
/// neither; each limit's window ends on its own calendar.
#[tokio::test]
async fn calendar_sets_hosts_agree() {
    let r = Some;
    const H: u64 = 3_600_000;
    run_table(&[Scenario {
        name: "2 per day in New York and 3 per month in UTC",
        limiter: set_day_new_york_month_utc,
        hosts: Hosts::All,
        steps: vec![
            // 17:00Z: 12 hours left of the day, 31 of the month.
            step(at("2027-01-30T12:00:00-05:00"), 1, Allowed, 1, 12 * H, None),
            step(
                at("2027-01-30T12:00:00-05:00"),
                1,
                HitQuota,
                0,
                12 * H,
                None,
            ),
            // The day refuses: the month is not spent.
            step(
                at("2027-01-30T12:00:00-05:00"),
                1,
                OverQuota,
                0,
                12 * H,
                r(12 * H),
            ),
            // A new day; the month's third unit, 19 hours before it ends.
            step(
                at("2027-01-31T00:00:00-05:00"),
                1,
                HitQuota,
                0,
                19 * H,
                None,
            ),
            // The month refuses for 7 hours.
            step(
                at("2027-01-31T12:00:00-05:00"),
                1,
                OverQuota,
                0,
                7 * H,
                r(7 * H),
            ),
            // February in UTC, still January 31 in New York: the day's second unit.
            step(at("2027-02-01T00:00:00Z"), 1, HitQuota, 0, 5 * H, None),
        ],
    }])
    .await;
}

/// On the server's clock, the Redis server decides which window a time is in, whatever
/// the caller's clock says: the caller sends the boundaries around its own time (the
/// window before, its own, the next), and the engine picks the window of `TIME` among
/// them. Two callers 2 s on either side of the server agree with it.
#[tokio::test]
async fn calendar_windows_follow_the_server_clock() {
    const H: u64 = 3_600_000;
    let (redis, clock) = RedisServer::start_with_clock();
    // Midnight in New York on the 23-hour day.
    let midnight = T0_MS + at("2026-03-08T00:00:00-05:00");
    for (skew_ms, server_ms, reset_ms) in [
        // The caller is 2 s behind: it thinks it is 23:59:58.5 on March 7.
        (-2_000, midnight + 500, 23 * H - 500),
        // The caller is 2 s ahead: it thinks the new day began a second ago.
        (2_000, midnight - 1_000, 1_000),
    ] {
        let server_us = server_ms * 1_000;
        let manual = ManualClock::new(u64::try_from(server_us).expect("after 1970"));
        let backend = support::backend_builder()
            .manual_clock(manual)
            .caller_clock_offset_us(skew_ms * 1_000)
            .deny_cache(0)
            .call_timeout(Duration::from_secs(10))
            .redis(redis.pool())
            .call_timeout(support::CALL_TIMEOUT)
            .build()
            .expect("backend");
        let limiter = day_new_york(&backend, &format!("server-clock-{skew_ms}"));
        clock.freeze_at(server_us);
        let decision = limiter.check(b"k", NonZeroU32::MIN).await;
        assert_eq!(decision.source, Source::Redis);
        assert_eq!(decision.state, Allowed);
        assert_eq!(
            decision.reset,
            Duration::from_millis(reset_ms),
            "caller {skew_ms} ms off the server"
        );
    }
    clock.set_offset_us(0);
}

// ---------------------------------------------------------------------------
// Priority classes
// ---------------------------------------------------------------------------

/// Priority classes on one limit (`LayerBuilder::priority`), on every algorithm and a
/// set: a class of 60% or 85% is admitted while its cost and what it leaves to the
/// others fit, spends only its cost, and is told what remains for it; a blocked key
/// refuses a class as its own check would; a cost above the class's part of the limit
/// can never be admitted.
#[tokio::test]
async fn priority_classes_hosts_agree() {
    let r = Some;
    let p = Op::Priority;
    run_table(&[
        Scenario {
            name: "classes on a fixed window: 6, 8 and 10 of 10",
            limiter: |backend, name| period(10, SEC)(backend, name),
            hosts: Hosts::All,
            steps: vec![
                with(p(60), step(0, 1, Allowed, 5, 1_000, None)),
                with(p(60), step(0, 4, Allowed, 1, 1_000, None)),
                with(p(60), step(0, 1, HitQuota, 0, 1_000, None)),
                with(p(60), step(10, 1, OverQuota, 0, 990, r(990))),
                with(p(85), step(10, 2, HitQuota, 0, 990, None)),
                with(p(85), step(20, 1, OverQuota, 0, 980, r(980))),
                step(20, 1, Allowed, 1, 980, None),
                // A class of 100%: a check.
                with(p(100), step(20, 1, HitQuota, 0, 980, None)),
                // Above 6, the class's part: never admitted.
                with(p(60), step(30, 7, ExceedsCapacity, 0, 1_000, None)),
                with(p(60), step(1_000, 6, HitQuota, 0, 1_000, None)),
            ],
        },
        Scenario {
            name: "classes on a blocked fixed window",
            limiter: |backend, name| period(10, SEC)(backend, name),
            hosts: Hosts::All,
            steps: vec![
                with(p(60), step(0, 6, HitQuota, 0, 1_000, None)),
                with(Op::Block, step(10, 100, OverQuota, 0, 990, r(100))),
                // Refused by its class past the block's end: the class's wait.
                with(p(60), step(20, 1, OverQuota, 0, 980, r(980))),
                step(20, 1, OverQuota, 0, 980, r(90)),
                with(p(60), step(200, 1, OverQuota, 0, 800, r(800))),
                with(p(85), step(200, 2, HitQuota, 0, 800, None)),
            ],
        },
        Scenario {
            name: "classes on a token bucket: 3, 4 and 5 of 5",
            limiter: bucket_10_per_second_burst_5,
            hosts: Hosts::All,
            steps: vec![
                with(p(60), step(0, 1, Allowed, 2, 100, None)),
                with(p(60), step(0, 2, HitQuota, 0, 300, None)),
                with(p(60), step(0, 1, OverQuota, 0, 300, r(100))),
                with(p(85), step(0, 1, HitQuota, 0, 400, None)),
                step(0, 1, HitQuota, 0, 500, None),
                with(p(60), step(150, 1, OverQuota, 0, 350, r(150))),
                with(p(60), step(300, 1, HitQuota, 0, 300, None)),
                with(p(60), step(400, 4, ExceedsCapacity, 0, 0, None)),
            ],
        },
        Scenario {
            name: "classes on a rolling window: 3, 4 and 5 of 5",
            limiter: rolling_5_per_10x100ms,
            hosts: Hosts::All,
            steps: vec![
                with(p(60), step(0, 2, Allowed, 1, 1_000, None)),
                with(p(60), step(50, 1, HitQuota, 0, 950, None)),
                with(p(60), step(150, 1, OverQuota, 0, 850, r(850))),
                with(p(85), step(150, 1, HitQuota, 0, 950, None)),
                step(200, 1, HitQuota, 0, 1_000, None),
                // The bucket of 0 ms (3 units) is gone.
                with(p(85), step(1_000, 1, Allowed, 1, 1_000, None)),
            ],
        },
        Scenario {
            name: "classes on a set: each limit holds its class back",
            limiter: set_bucket_and_rolling,
            hosts: Hosts::All,
            steps: vec![
                with(p(60), step(0, 1, HitQuota, 0, 100, None)),
                // Refused by both; the rolling window waits longest.
                with(p(60), step(0, 1, OverQuota, 0, 1_000, r(1_000))),
                step(0, 1, HitQuota, 0, 200, None),
                with(p(85), step(100, 1, OverQuota, 0, 900, r(900))),
                step(200, 1, HitQuota, 0, 1_000, None),
            ],
        },
    ])
    .await;
}
