//! Shared calls against a real `redis-server`: concurrent checks of one key share script
//! calls (coalescing), and so do checks of many keys of one limiter once its calls in
//! flight reach their bound (batching); their decisions are exactly those of one check
//! at a time, for every algorithm and a set, with mixed costs and a cost above the limit.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use support::{RedisServer, Reply};
use tower_redis_ratelimit::{Backend, Decision, Limiter, Source, State};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const HOUR: Duration = Duration::from_secs(3_600);

/// Limits that nothing refills during a test: one of each algorithm, and a set.
fn limiters(backend: &Backend) -> Vec<(&'static str, Box<dyn Limiter>)> {
    vec![
        (
            "period",
            Box::new(PeriodLimiter::new(backend, "p", PeriodConfig::new(20, HOUR)).unwrap()),
        ),
        (
            "token_bucket",
            Box::new(
                TokenBucketLimiter::new(backend, "t", TokenBucketConfig::new(1, HOUR, 20)).unwrap(),
            ),
        ),
        (
            "rolling",
            Box::new(
                RollingWindowLimiter::new(backend, "r", RollingConfig::new(20, 10, HOUR)).unwrap(),
            ),
        ),
        (
            "set",
            Box::new(
                SetLimiter::new(
                    backend,
                    "s",
                    LimitSet::new()
                        .limit("burst", TokenBucketConfig::new(1, HOUR, 20))
                        .limit("window", PeriodConfig::new(15, HOUR)),
                )
                .unwrap(),
            ),
        ),
        (
            // The engine's arguments hold the window's boundaries before the costs.
            "calendar",
            Box::new(
                PeriodLimiter::new(backend, "c", PeriodConfig::calendar(20, month())).unwrap(),
            ),
        ),
        (
            "calendar set",
            Box::new(
                SetLimiter::new(
                    backend,
                    "cs",
                    LimitSet::new()
                        .limit("burst", TokenBucketConfig::new(1, HOUR, 20))
                        .limit("month", PeriodConfig::calendar(15, month())),
                )
                .unwrap(),
            ),
        ),
    ]
}

/// A calendar month in UTC: it ends during a run once in a month of runs at most.
fn month() -> Calendar {
    Calendar::month("UTC")
}

/// 40 costs from 1 to 4, and one above every limit.
fn costs() -> Vec<NonZeroU32> {
    let mut costs: Vec<u32> = (0..40).map(|i| 1 + (i * 7 + 3) % 4).collect();
    costs[17] = 25;
    costs
        .into_iter()
        .map(|c| NonZeroU32::new(c).unwrap())
        .collect()
}

/// Costs that every limit above admits together (10 units: the fast path of a
/// coalesced call, which decides only when every check is admitted).
fn fitting() -> Vec<NonZeroU32> {
    [1, 2, 1, 3, 1, 2]
        .into_iter()
        .map(|c| NonZeroU32::new(c).unwrap())
        .collect()
}

/// The state and remaining units of each check of `costs`, all started at once (in
/// this order).
async fn at_once(limiter: &dyn Limiter, key: &[u8], costs: &[NonZeroU32]) -> Vec<(State, u64)> {
    let checks: Vec<_> = costs.iter().map(|&c| limiter.check(key, c)).collect();
    let mut answers = Vec::new();
    for decision in futures_join(checks).await {
        assert_ne!(decision.source, Source::Fallback, "{decision:?}");
        answers.push((decision.state, decision.remaining));
    }
    answers
}

/// Polls every check together, and returns their decisions in order.
async fn futures_join(
    checks: Vec<tower_redis_ratelimit::DecisionFuture>,
) -> Vec<tower_redis_ratelimit::Decision> {
    let handles: Vec<_> = checks.into_iter().map(tokio::spawn).collect();
    let mut decisions = Vec::new();
    for handle in handles {
        decisions.push(handle.await.unwrap());
    }
    decisions
}

#[tokio::test]
async fn coalesced_decisions_equal_one_check_at_a_time() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let in_process = Backend::in_process();
    for ((name, limiter), (_, reference)) in
        limiters(&backend).into_iter().zip(limiters(&in_process))
    {
        // Loads the script, so that the counted calls are the checks' own.
        limiter.check(b"warm-up", NonZeroU32::MIN).await;
        // Checks that all fit (the fast path), then checks past the limits (one above
        // the capacity, answered without Redis): each time one call leads, and the
        // others, queued behind it, go together in one.
        for (key, costs) in [(&b"fits"[..], fitting()), (&b"hot"[..], costs())] {
            let calls = redis.command_calls("evalsha");
            let coalesced = at_once(&*limiter, key, &costs).await;
            let used = redis.command_calls("evalsha") - calls;
            let mut one_by_one = Vec::new();
            for &cost in &costs {
                let decision = reference.check(key, cost).await;
                one_by_one.push((decision.state, decision.remaining));
            }
            let fit = key == b"fits";
            assert_eq!(coalesced, one_by_one, "{name}, fit {fit}");
            let refused = coalesced.iter().any(|(s, _)| *s == State::OverQuota);
            let above = coalesced.iter().any(|(s, _)| *s == State::ExceedsCapacity);
            assert!(
                if fit { !refused } else { refused && above },
                "{name}: {coalesced:?}"
            );
            assert_eq!(
                used,
                2,
                "{name}, fit {fit}: {used} calls for {} checks",
                costs.len()
            );
        }
    }
}

#[tokio::test]
async fn without_coalescing_every_check_is_a_call() {
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .deny_cache(0)
        .coalesce(false)
        .batch_after(0)
        .build()
        .unwrap();
    let in_process = Backend::in_process();
    let (limiter, reference) = (&limiters(&backend)[1].1, &limiters(&in_process)[1].1);
    limiter.check(b"warm-up", NonZeroU32::MIN).await;
    let calls = redis.command_calls("evalsha");
    let decisions = at_once(&**limiter, b"hot", &costs()).await;
    // Every check but the one above the limit (answered without Redis).
    assert_eq!(redis.command_calls("evalsha") - calls, 39);
    let mut one_by_one = Vec::new();
    for cost in costs() {
        let decision = reference.check(b"hot", cost).await;
        one_by_one.push((decision.state, decision.remaining));
    }
    assert_eq!(decisions, one_by_one);
}

/// Every kind of limit a batch decides, by name: each algorithm with and without a
/// lockout, an aligned window, and a set.
fn every_limit(backend: &Backend, name: &str) -> Vec<(String, Box<dyn Limiter>)> {
    let lock = Duration::from_secs(2);
    let bucket = || TokenBucketConfig::new(1, HOUR, 20);
    let window = || PeriodConfig::new(20, HOUR);
    // Buckets of a second: a refusal's retry-after depends on which bucket holds what.
    let rolling = || RollingConfig::new(20, 10, Duration::from_secs(10));
    let named = |kind: &str| format!("{name}-{kind}");
    let limits: Vec<(&str, Box<dyn Limiter>)> = vec![
        (
            "period",
            Box::new(PeriodLimiter::new(backend, &named("period"), window()).unwrap()),
        ),
        (
            "period-aligned",
            Box::new(
                PeriodLimiter::new(backend, &named("aligned"), window().align(UtcOffset::UTC))
                    .unwrap(),
            ),
        ),
        (
            "period-lockout",
            Box::new(PeriodLimiter::new(backend, &named("pl"), window().lockout(lock)).unwrap()),
        ),
        (
            "token_bucket",
            Box::new(TokenBucketLimiter::new(backend, &named("token"), bucket()).unwrap()),
        ),
        (
            "token_bucket-lockout",
            Box::new(
                TokenBucketLimiter::new(backend, &named("tl"), bucket().lockout(lock)).unwrap(),
            ),
        ),
        (
            "rolling",
            Box::new(RollingWindowLimiter::new(backend, &named("rolling"), rolling()).unwrap()),
        ),
        (
            "rolling-lockout",
            Box::new(
                RollingWindowLimiter::new(backend, &named("rl"), rolling().lockout(lock)).unwrap(),
            ),
        ),
        (
            "set",
            Box::new(
                SetLimiter::new(
                    backend,
                    &named("set"),
                    LimitSet::new()
                        .limit("burst", bucket())
                        .limit("window", PeriodConfig::new(15, HOUR))
                        .limit(
                            "rolling",
                            RollingConfig::new(17, 10, Duration::from_secs(10)),
                        ),
                )
                .unwrap(),
            ),
        ),
    ];
    limits
        .into_iter()
        .map(|(kind, l)| (kind.to_owned(), l))
        .collect()
}

/// A coalesced call reads each key once, decides every check on that state and writes once: on
/// a frozen server clock its decisions are those of the same checks one by one to the
/// microsecond (reset and retry-after included), and it leaves the same state behind
/// (the next checks, a second later, agree too), after a fresh start, after use, and
/// after the server's clock stepped back (each algorithm's repair is written once).
#[tokio::test]
async fn a_coalesced_call_decides_and_writes_as_its_checks_one_by_one() {
    let (redis, clock) = RedisServer::start_with_clock();
    let t0: i64 = 1_800_000_000_000_000 + 123_456;
    let coalesced = redis.uncached_backend();
    let single = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .deny_cache(0)
        .coalesce(false)
        .build()
        .unwrap();
    // History: (µs after t0, cost) checks made one by one before the batch at t0.
    let histories: [(&str, &[(i64, u32)]); 3] = [
        ("fresh", &[]),
        ("used", &[(-5_000_000, 3), (-2_000_000, 4)]),
        (
            "stepped back",
            &[(-1_000_000, 2), (5_000_000, 5), (8_000_000, 1)],
        ),
    ];
    for (history, checks) in histories {
        let batched = every_limit(&coalesced, &format!("b-{history}"));
        let one_by_one = every_limit(&single, &format!("s-{history}"));
        for ((kind, batched), (_, reference)) in batched.into_iter().zip(one_by_one) {
            let what = format!("{kind}, {history}");
            for &(at, cost) in checks {
                clock.freeze_at(t0 + at);
                let cost = NonZeroU32::new(cost).unwrap();
                let (a, b) = (
                    batched.check(b"k", cost).await,
                    reference.check(b"k", cost).await,
                );
                assert_eq!(answer(&a), answer(&b), "{what}: history at {at} µs");
            }
            clock.freeze_at(t0);
            // Checks that all fit (the fast path), then checks past the limits; checks of
            // one cost (their cost sent once) too.
            let same = |cost, count| vec![NonZeroU32::new(cost).unwrap(); count];
            for (fit, costs) in [
                (true, same(1, 4)),
                (true, fitting()),
                (false, costs()),
                (false, same(2, 30)),
            ] {
                let calls = redis.command_calls("evalsha");
                let together: Vec<_> =
                    futures_join(costs.iter().map(|&c| batched.check(b"k", c)).collect())
                        .await
                        .iter()
                        .map(answer)
                        .collect();
                let used = redis.command_calls("evalsha") - calls;
                assert!(used <= 2, "{what}, fit {fit}: {used} calls");
                let mut alone = Vec::new();
                for &cost in &costs {
                    alone.push(answer(&reference.check(b"k", cost).await));
                }
                assert_eq!(together, alone, "{what}, fit {fit}");
                // (A set's window has 8 units left after the "used" history: its checks
                // that fit elsewhere go past it.)
                assert!(
                    fit || together.iter().any(|a| a.0 == State::OverQuota),
                    "{what}: {together:?}"
                );
            }
            // The state each left behind.
            clock.freeze_at(t0 + 1_000_000);
            for cost in [1, 3] {
                let cost = NonZeroU32::new(cost).unwrap();
                let (a, b) = (
                    batched.check(b"k", cost).await,
                    reference.check(b"k", cost).await,
                );
                assert_eq!(answer(&a), answer(&b), "{what}: after the batch");
            }
        }
    }
}

/// A coalesced call replies with one item per check, and an admit is what a fast path
/// replies: one packed number per limit. So a hot key's call carries about a number per
/// check and limit, not the general engine's table of six or nine (which Redis builds
/// and the client parses, for every check of the queue). The call's reply is one table
/// (the count of limits, then the items), as a batch's of many keys: an admit is never
/// a table in it, not a set's, not a large limit's too large to pack (a wide admit:
/// three numbers), since a table in a table costs Redis about 4 500 instructions to
/// reply. Refusals keep their table. (The decisions read back from these replies are
/// those of one check at a time: the tests above.)
#[test]
fn a_coalesced_call_replies_one_item_per_check_an_admit_packed() {
    let redis = RedisServer::start();
    let script = tower_redis_ratelimit::engine_script();
    // A token bucket of 3 tokens (one an hour), alone and in a set with a fixed window
    // of 4 an hour, or of 2^40 a day (too large to pack); costs 1, 1, 5 (refused), 1, 1
    // (refused: the bucket is empty).
    let bucket = "t:3:3600000000:3:1767225600";
    let pair = format!("{bucket}:w:2:4:3600000");
    let large = format!("{bucket}:w:2:1099511627776:86400000");
    let costs = ["1", "1", "5", "1", "1"];
    let shapes = |reply: &Reply| -> Vec<&'static str> {
        let Reply::Array(items) = reply else {
            panic!("not a table: {reply:?}");
        };
        let mut items = items.iter();
        let Some(&Reply::Int(n @ 1..)) = items.next() else {
            panic!("not the count of limits first: {reply:?}");
        };
        let mut shapes = Vec::new();
        while let Some(item) = items.next() {
            match item {
                Reply::Int(first) if *first < 0 => {
                    // The item's n admits: each packed, or wide (bits 0, then n and t).
                    let mut admit = Some(*first);
                    let mut wide = false;
                    for _ in 0..n {
                        let packed = admit.take().unwrap_or_else(|| match items.next() {
                            Some(Reply::Int(packed)) if *packed < 0 => *packed,
                            other => panic!("not an admit: {other:?} in {reply:?}"),
                        });
                        if -(packed + 1) & 63 == 0 {
                            wide = true;
                            for _ in 0..2 {
                                assert!(matches!(items.next(), Some(Reply::Int(0..))), "{reply:?}");
                            }
                        }
                    }
                    shapes.push(match (n, wide) {
                        (1, false) => "packed",
                        (1, true) => "wide",
                        (_, false) => "packed set",
                        (_, true) => "wide set",
                    });
                }
                Reply::Array(inner) if matches!(inner.first(), Some(Reply::Int(0))) => {
                    shapes.push("refusal");
                }
                _ => panic!("an item of another shape: {item:?} in {reply:?}"),
            }
        }
        shapes
    };
    let coalesced_of = |keys: &[&str], head: &str, limits: &str, costs: &[&str]| {
        let count = keys.len().to_string();
        redis.cmd_reply(&[&["EVAL", &script, &count][..], keys, &[head, limits], costs].concat())
    };
    let coalesced = |keys: &[&str], limits: &str| coalesced_of(keys, "m:5:0", limits, &costs);
    let one = coalesced(&["{a}", "{a}:block"], bucket);
    assert_eq!(
        shapes(&one),
        ["packed", "packed", "refusal", "packed", "refusal"],
        "{one:?}"
    );
    let set = coalesced(&["{b}:t", "{b}:w", "{b}:block"], &pair);
    assert_eq!(
        shapes(&set),
        [
            "packed set",
            "packed set",
            "refusal",
            "packed set",
            "refusal"
        ],
        "{set:?}"
    );
    let set = coalesced(&["{c}:t", "{c}:w", "{c}:block"], &large);
    assert_eq!(
        shapes(&set),
        ["wide set", "wide set", "refusal", "wide set", "refusal"],
        "{set:?}"
    );
    // Checks of one cost, the cost sent once (`M`), alike: a bucket of 3 tokens admits
    // three of five, a set's window of 4 four of five; every admit packed, or wide.
    let one = coalesced_of(&["{f}", "{f}:block"], "M:5:0", bucket, &["1"]);
    assert_eq!(
        shapes(&one),
        ["packed", "packed", "packed", "refusal", "refusal"],
        "{one:?}"
    );
    let window = "w:2:4:3600000";
    let one = coalesced_of(&["{g}", "{g}:block"], "M:5:0", window, &["1"]);
    assert_eq!(
        shapes(&one),
        ["packed", "packed", "packed", "packed", "refusal"],
        "{one:?}"
    );
    let set = coalesced_of(&["{h}:t", "{h}:w", "{h}:block"], "M:3:0", &large, &["1"]);
    assert_eq!(
        shapes(&set),
        ["wide set", "wide set", "wide set"],
        "{set:?}"
    );
    // A batch of keys (checks of one cost: `K`) replies alike.
    let keys = ["{d}:t", "{d}:w", "{d}:block", "{e}:t", "{e}:w", "{e}:block"];
    for (limits, shape) in [(&pair, "packed set"), (&large, "wide set")] {
        let batch = redis
            .cmd_reply(&[&["EVAL", &script, "6"][..], &keys, &["K:2:0", limits, "1"]].concat());
        assert_eq!(shapes(&batch), [shape, shape], "{batch:?}");
    }
}

/// Everything a decision says, and that it came from Redis.
fn answer(decision: &Decision) -> (State, u64, Duration, Option<Duration>) {
    assert_eq!(decision.source, Source::Redis, "{decision:?}");
    (
        decision.state,
        decision.remaining,
        decision.reset,
        decision.retry_after,
    )
}

/// A check that queues behind a call of its key in flight waits for at most the call
/// timeout from its own arrival, as a check making its own call does: with Redis
/// paused, a follower that arrives a quarter of the way through the leader's call is
/// answered by the failure policy when its own deadline passes, not after the rest of
/// the leader's call and then the queue's call (one and three quarter call timeouts:
/// 1.75 s here, where the deadline is 1 s; the test allows 1.5 s, the half second above
/// the deadline for the scheduler).
#[tokio::test]
async fn a_coalesced_check_waits_at_most_the_call_timeout_from_its_arrival() {
    waits_at_most_the_call_timeout(b"hot").await;
}

/// So does a check of another key that queued for a batch (one call in flight allowed).
#[tokio::test]
async fn a_batched_check_waits_at_most_the_call_timeout_from_its_arrival() {
    waits_at_most_the_call_timeout(b"other").await;
}

/// A check of `key` made a quarter of the way through a check of "hot" with Redis
/// paused: answered by the failure policy no later than its own call timeout.
async fn waits_at_most_the_call_timeout(key: &[u8]) {
    // (A second, and the follower a quarter of it in: with 200 ms, and the follower
    // halfway, a busy CI machine's scheduler had 50 ms between a right wait and the
    // mistake's.)
    let timeout = Duration::from_secs(1);
    let mut redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .deny_cache(0)
        .call_timeout(timeout)
        .batch_after(1)
        .build()
        .unwrap();
    let limiter = PeriodLimiter::new(&backend, "wait", PeriodConfig::new(1_000_000, HOUR)).unwrap();
    // Connected, and the engine loaded. (Then more checks: a check queues for a batch
    // only while the round trip the limiter knows, a moving average that starts with
    // the first call, which connects and loads the engine, is at most an eighth of the
    // call timeout.)
    for _ in 0..8 {
        assert_eq!(
            limiter.check(b"hot", NonZeroU32::MIN).await.source,
            Source::Redis
        );
    }
    redis.pause();
    let leader = async {
        let started = tokio::time::Instant::now();
        let decision = limiter.check(b"hot", NonZeroU32::MIN).await;
        (decision.source, started.elapsed())
    };
    let follower = async {
        tokio::time::sleep(timeout / 4).await;
        let started = tokio::time::Instant::now();
        let decision = limiter.check(key, NonZeroU32::MIN).await;
        (decision.source, started.elapsed())
    };
    let ((leader_source, _), (follower_source, waited)) = tokio::join!(leader, follower);
    redis.resume();
    eprintln!("the follower waited {waited:?} (call timeout {timeout:?})");
    assert_eq!(leader_source, Source::Fallback);
    assert_eq!(follower_source, Source::Fallback);
    assert!(
        waited < timeout + timeout / 2,
        "the follower waited {waited:?}, past its call timeout of {timeout:?}"
    );
}

/// A check that leads a call and is dropped before its call ends (its request
/// cancelled) hands over all the same: the checks queued behind it, of its key
/// (coalesced) and of another key (batched, one call in flight allowed), go to Redis at
/// once, not at their deadline by the failure policy; then the key and the route are
/// free again.
#[tokio::test]
async fn a_dropped_leader_hands_its_queues_over() {
    let timeout = Duration::from_secs(5);
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .deny_cache(0)
        .call_timeout(timeout)
        .batch_after(1)
        .build()
        .unwrap();
    let limiter = PeriodLimiter::new(&backend, "drop", PeriodConfig::new(1_000_000, HOUR)).unwrap();
    // Connected, the engine loaded, and a round trip known (see above).
    for _ in 0..8 {
        assert_eq!(
            limiter.check(b"hot", NonZeroU32::MIN).await.source,
            Source::Redis
        );
    }
    // The leader takes the key's turn and the route's one call, and is dropped before
    // its call is made.
    let leader = limiter.check(b"hot", NonZeroU32::MIN);
    let same_key = limiter.check(b"hot", NonZeroU32::MIN);
    let other_key = limiter.check(b"other", NonZeroU32::MIN);
    drop(leader);
    let started = tokio::time::Instant::now();
    let (same_key, other_key) = tokio::join!(same_key, other_key);
    let waited = started.elapsed();
    assert_eq!(same_key.source, Source::Redis);
    assert_eq!(other_key.source, Source::Redis);
    assert!(waited < timeout / 2, "the queued checks waited {waited:?}");
    for key in [&b"hot"[..], b"other"] {
        let decision = limiter.check(key, NonZeroU32::MIN).await;
        assert_eq!(decision.source, Source::Redis);
    }
    // Each check spent its cost once: 8 and 2 of "hot", 2 of "other".
    let hot = limiter.check(b"hot", NonZeroU32::MIN).await;
    let other = limiter.check(b"other", NonZeroU32::MIN).await;
    assert_eq!(
        (hot.remaining, other.remaining),
        (1_000_000 - 11, 1_000_000 - 3)
    );
}

/// The script calls (`FCALL` and `EVALSHA`) `redis` has run so far (`command_calls`
/// counts both under `evalsha`).
fn script_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha")
}

/// The keys of one round of batched checks, all at once: 24, one of them twice (a key
/// may be in a batch twice without coalescing).
fn round_keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    keys[17] = "k5".to_owned();
    keys
}

/// A check's cost in round `round` for the key at `at`: 1 to 4, and now and then one
/// above every limit.
fn round_cost(round: usize, at: usize) -> NonZeroU32 {
    let cost = if (round * 24 + at) % 29 == 11 {
        25
    } else {
        1 + (round * 7 + at * 3) % 4
    };
    NonZeroU32::new(u32::try_from(cost).unwrap()).unwrap()
}

/// A check's cost in round `round` when every check of the round costs the same (a
/// batch then sends its cost once): 1 to 4, and in one round one above every limit.
fn round_cost_shared(round: usize, _at: usize) -> NonZeroU32 {
    let cost = if round == 5 { 25 } else { 1 + round % 4 };
    NonZeroU32::new(u32::try_from(cost).unwrap()).unwrap()
}

/// Every limit of [`every_limit`] twice on `redis` (names starting `run`): on a backend
/// that batches past one call in flight, and on one that never batches (the reference),
/// each having made a first call (checks queue once a round trip is known). Both
/// without coalescing or a deny cache, on the engine path and clock given.
async fn batching_and_reference(
    redis: &RedisServer,
    functions: bool,
    time: tower_redis_ratelimit::TimeSource,
    run: &str,
) -> Vec<(String, Box<dyn Limiter>, Box<dyn Limiter>)> {
    let backend = |batch_after| {
        support::backend_builder()
            .redis(redis.pool())
            .deny_cache(0)
            .coalesce(false)
            .engine_functions(functions)
            .time_source(time)
            // A generous deadline: a loaded machine must not turn a slow call into a
            // fallback.
            .call_timeout(Duration::from_secs(5))
            .batch_after(batch_after)
            .build()
            .unwrap()
    };
    let batched = every_limit(&backend(1), &format!("b-{run}"));
    let one_by_one = every_limit(&backend(0), &format!("s-{run}"));
    let mut pairs = Vec::new();
    for ((kind, batched), (_, reference)) in batched.into_iter().zip(one_by_one) {
        for limiter in [&batched, &reference] {
            limiter.check(b"warm-up", NonZeroU32::MIN).await;
        }
        pairs.push((kind, batched, reference));
    }
    pairs
}

/// Checks of many keys of one limiter, made at once past the bound of calls in flight,
/// go to Redis in a few calls, and each decides exactly as its own call would: on a
/// frozen server clock, round after round (admits, refusals, lockouts and the blocks
/// they leave, an aligned window, a set, costs above the limit), each answer equals the
/// same check's made one by one on another limiter of the same server, to the
/// microsecond, on both engine paths. With the caller's clock (the time sent last,
/// after the costs), the states and units agree. Alike when the checks of a round cost
/// the same (their batches send the cost once).
#[tokio::test]
async fn a_batch_of_keys_decides_as_its_checks_one_by_one() {
    use tower_redis_ratelimit::TimeSource;
    let (redis, clock) = RedisServer::start_with_clock();
    let t0: i64 = 1_800_000_000_000_000 + 654_321;
    type Costs = fn(usize, usize) -> NonZeroU32;
    for (functions, time, round_cost, costs) in [
        (true, TimeSource::Server, round_cost as Costs, "mixed"),
        (false, TimeSource::Server, round_cost, "mixed"),
        (true, TimeSource::Caller, round_cost, "mixed"),
        (true, TimeSource::Server, round_cost_shared, "shared"),
        (false, TimeSource::Server, round_cost_shared, "shared"),
        (true, TimeSource::Caller, round_cost_shared, "shared"),
    ] {
        let run = format!("{functions}-{time:?}-{costs}");
        for (kind, batched, reference) in
            batching_and_reference(&redis, functions, time, &run).await
        {
            let what = format!("{kind}, functions: {functions}, {time:?}, {costs} costs");
            let (mut checks, mut calls) = (0, 0);
            for round in 0..8 {
                clock.freeze_at(t0 + i64::try_from(round).unwrap() * 400_000);
                let keys = round_keys();
                let before = script_calls(&redis);
                let together = futures_join(
                    keys.iter()
                        .enumerate()
                        .map(|(at, key)| batched.check(key.as_bytes(), round_cost(round, at)))
                        .collect(),
                )
                .await;
                calls += script_calls(&redis) - before;
                checks += keys.len();
                for (at, (key, decision)) in keys.iter().zip(together).enumerate() {
                    let alone = reference.check(key.as_bytes(), round_cost(round, at)).await;
                    let here = format!("{what}: round {round}, {key}");
                    if time == TimeSource::Server {
                        assert_eq!(answer(&decision), answer(&alone), "{here}");
                    } else {
                        assert_eq!(
                            (decision.state, decision.remaining, decision.source),
                            (alone.state, alone.remaining, Source::Redis),
                            "{here}"
                        );
                    }
                }
            }
            // A call for the first check of a round, a few for the rest of it (one
            // round: 24 checks).
            assert!(
                calls * 4 <= checks as u64,
                "{what}: {calls} calls for {checks} checks"
            );
        }
    }
}

/// A key whose stored value Redis refuses (`WRONGTYPE`) fails its own check (its own
/// settlement) alone: its item in the batch fails, the other keys are decided by Redis
/// and the bad key by the failure policy. Its error is reported for that key, a check's
/// and a settlement's alike (logged once a while per key), in words that say what
/// happened.
#[tokio::test]
async fn a_key_error_in_a_batch_is_that_keys_alone() {
    let (logs, _guard) = support::logs::capture(tracing::Level::WARN);
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .deny_cache(0)
        .coalesce(false)
        .batch_after(1)
        .build()
        .unwrap();
    let limiter =
        TokenBucketLimiter::new(&backend, "wrong", TokenBucketConfig::new(1, HOUR, 20)).unwrap();
    // Two keys whose values something else replaced: one for the checks, one for the
    // settlements (a key's error is logged once a while).
    for bad in ["bad", "worse"] {
        limiter.check(bad.as_bytes(), NonZeroU32::MIN).await;
        let stored = redis.cmd(&["KEYS", &format!("*{bad}*")]);
        let stored = stored
            .lines()
            .next()
            .expect("the key's value")
            .trim()
            .to_owned();
        redis.cmd(&["DEL", &stored]);
        redis.cmd(&["LPUSH", &stored, "not a bucket"]);
    }
    let keys = ["first", "a", "bad", "b", "c"];
    let decisions = futures_join(
        keys.iter()
            .map(|key| limiter.check(key.as_bytes(), NonZeroU32::MIN))
            .collect(),
    )
    .await;
    for (key, decision) in keys.iter().zip(decisions) {
        if *key == "bad" {
            assert_eq!(decision.source, Source::Fallback, "{key}: {decision:?}");
        } else {
            assert_eq!(
                (decision.source, decision.remaining),
                (Source::Redis, 19),
                "{key}"
            );
        }
    }
    let keys = ["first", "a", "worse", "b", "c"];
    let settled = futures_join(
        keys.iter()
            .map(|key| limiter.settle(key.as_bytes(), -1).expect("settles"))
            .collect(),
    )
    .await;
    for (key, decision) in keys.iter().zip(settled) {
        if *key == "worse" {
            assert_eq!(decision.source, Source::Fallback, "{key}: {decision:?}");
        } else {
            assert_eq!(
                (decision.source, decision.remaining),
                (Source::Redis, 20),
                "{key}"
            );
        }
    }
    let text = logs.text();
    let reported = text
        .lines()
        .filter(|line| line.contains("redis error for one key"))
        .collect::<Vec<_>>();
    assert_eq!(reported.len(), 2, "{text}");
    for line in reported {
        assert!(line.contains("could not read this key's value"), "{line}");
    }
}

/// A settlement's delta in round `round` for the key at `at`: given back or charged,
/// now and then 0 or past every limit (debt).
fn round_delta(round: usize, at: usize) -> i64 {
    match (round * 24 + at) % 13 {
        4 => 0,
        9 => 30,
        n => [-3, -1, 2, 5, -2, 1][n % 6],
    }
}

/// Settlements of many keys of one limiter, made at once past the bound of calls in
/// flight, go with the batches as checks do (a few calls, not one each), and each
/// settles exactly as its own call would: on a frozen server clock, round after round
/// (refunds, charges, debt, a delta of 0, a set, lockouts), each answer equals the same
/// settlement's made one by one on another limiter of the same server, to the
/// microsecond, on both engine paths, and the keys stand where they do there (the next
/// round's checks agree too).
#[tokio::test]
async fn settlements_go_with_the_batches_and_settle_as_one_by_one() {
    use tower_redis_ratelimit::TimeSource;
    let (redis, clock) = RedisServer::start_with_clock();
    let t0: i64 = 1_800_000_000_000_000 + 321_987;
    for functions in [true, false] {
        let run = format!("settle-{functions}");
        let server = TimeSource::Server;
        for (kind, batched, reference) in
            batching_and_reference(&redis, functions, server, &run).await
        {
            let what = format!("{kind}, functions: {functions}");
            let (mut settlements, mut calls) = (0, 0);
            for round in 0..6 {
                clock.freeze_at(t0 + i64::try_from(round).unwrap() * 400_000);
                let keys = round_keys();
                for (at, key) in keys.iter().enumerate() {
                    let cost = round_cost(round, at);
                    let here = format!("{what}: round {round}, check of {key}");
                    let mine = batched.check(key.as_bytes(), cost).await;
                    let theirs = reference.check(key.as_bytes(), cost).await;
                    assert_eq!(answer(&mine), answer(&theirs), "{here}");
                }
                let before = script_calls(&redis);
                let together = futures_join(
                    keys.iter()
                        .enumerate()
                        .map(|(at, key)| {
                            batched
                                .settle(key.as_bytes(), round_delta(round, at))
                                .expect("settles")
                        })
                        .collect(),
                )
                .await;
                calls += script_calls(&redis) - before;
                settlements += keys.len();
                for (at, (key, decision)) in keys.iter().zip(together).enumerate() {
                    let delta = round_delta(round, at);
                    let alone = reference
                        .settle(key.as_bytes(), delta)
                        .expect("settles")
                        .await;
                    let here = format!("{what}: round {round}, {key} settled by {delta}");
                    assert_eq!(answer(&decision), answer(&alone), "{here}");
                }
            }
            // A call for the first settlement of a round, a few for the rest of it.
            assert!(
                calls * 4 <= settlements as u64,
                "{what}: {calls} calls for {settlements} settlements"
            );
        }
    }
}

/// A batch of checks that cost the same sends their cost once (an argument costs Redis
/// about as much as a key: reading it, and a string in the script's `ARGV`), where each
/// item sent its own: the head, the limits and the cost after the keys, on both engine
/// paths.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_one_cost_sends_it_once() {
    use support::monitor::{script_calls, Monitor};
    let redis = RedisServer::start();
    for functions in [true, false] {
        let backend = support::backend_builder()
            .redis(redis.pool())
            .deny_cache(0)
            .coalesce(false)
            .engine_functions(functions)
            .call_timeout(Duration::from_secs(5))
            .batch_after(1)
            .build()
            .unwrap();
        let limiter =
            TokenBucketLimiter::new(&backend, "shared", TokenBucketConfig::new(100, HOUR, 100))
                .unwrap();
        let two = NonZeroU32::new(2).unwrap();
        assert!(limiter.check(b"warm-up", two).await.is_admitted());
        let monitor = Monitor::start(redis.port());
        let _ = monitor.until(redis.port(), "shared-start");
        let checks: Vec<_> = (0..24)
            .map(|i| limiter.check(format!("k{i}-{functions}").as_bytes(), two))
            .collect();
        for decision in futures_join(checks).await {
            assert_eq!(decision.remaining, 98, "{decision:?}");
        }
        let lines = monitor.until(redis.port(), "shared-end");
        let mut batches = 0;
        for words in script_calls(&lines) {
            let keys: usize = std::str::from_utf8(&words[2]).unwrap().parse().unwrap();
            if keys <= 2 {
                // (A check of its own.)
                continue;
            }
            batches += 1;
            assert_eq!(
                words.len() - 3 - keys,
                3,
                "functions: {functions}: a batch of {} checks: {:?}",
                keys / 2,
                &words[3 + keys..]
            );
        }
        assert!(batches > 0, "functions: {functions}: no batch in {lines:?}");
    }
}

/// Coalesced checks of a hot key that cost the same send their cost once (`M`), where
/// each check sent its own (`m`): the head, the limits and the cost after the key and
/// its block, on both engine paths. Checks of several costs still send each.
#[tokio::test(flavor = "multi_thread")]
async fn coalesced_checks_of_one_cost_send_it_once() {
    use support::monitor::{script_calls, Monitor};
    let redis = RedisServer::start();
    for functions in [true, false] {
        let backend = support::backend_builder()
            .redis(redis.pool())
            .deny_cache(0)
            .engine_functions(functions)
            .call_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let limiter =
            TokenBucketLimiter::new(&backend, "hot", TokenBucketConfig::new(1000, HOUR, 1000))
                .unwrap();
        let key = format!("k-{functions}");
        let (one, two) = (NonZeroU32::MIN, NonZeroU32::new(2).unwrap());
        assert!(limiter.check(b"warm-up", two).await.is_admitted());
        let monitor = Monitor::start(redis.port());
        let _ = monitor.until(redis.port(), "hot-start");
        let shared: Vec<_> = (0..24)
            .map(|_| limiter.check(key.as_bytes(), two))
            .collect();
        for decision in futures_join(shared).await {
            assert!(decision.is_admitted(), "{decision:?}");
        }
        let mixed: Vec<_> = (0..24)
            .map(|i| limiter.check(key.as_bytes(), if i % 2 == 0 { one } else { two }))
            .collect();
        for decision in futures_join(mixed).await {
            assert!(decision.is_admitted(), "{decision:?}");
        }
        let lines = monitor.until(redis.port(), "hot-end");
        let mut sent = Vec::new();
        for words in script_calls(&lines) {
            let keys: usize = std::str::from_utf8(&words[2]).unwrap().parse().unwrap();
            let head = std::str::from_utf8(&words[3 + keys]).unwrap();
            let (op, count) = head.split_once(':').unwrap();
            if op == "c" {
                // (A check of its own: a call's leader.)
                continue;
            }
            let count: usize = count.split(':').next().unwrap().parse().unwrap();
            // The keys, the head and the limits, then the costs.
            sent.push((op.to_owned(), count, words.len() - 5 - keys));
        }
        let what = format!("functions: {functions}: {sent:?}");
        assert!(sent.iter().any(|(op, _, _)| op == "M"), "{what}");
        assert!(sent.iter().any(|(op, _, _)| op == "m"), "{what}");
        for (op, count, costs) in &sent {
            assert_eq!(*costs, if op == "M" { 1 } else { *count }, "{what}");
        }
    }
}
