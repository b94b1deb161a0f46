//! Servers that refuse something the scripts need get a clear answer at start-up:
//! [`Backend::warm_up`] names what was refused and the remedy (a server that refuses
//! `TIME` inside scripts: `TimeSource::Caller`; one that refuses scripts: no remedy in
//! the crate). Refusals are made real with ACL users on a real server (as managed
//! services do with their own rules).

mod support;

use std::num::NonZeroU32;

use support::RedisServer;
use tower_redis_ratelimit::TimeSource;
use tower_redis_ratelimit::{Backend, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

/// Adds the ACL user `user` (password `pw`) with every right but `denied` (ACL rules,
/// such as `-time`).
fn add_user(redis: &RedisServer, user: &str, denied: &[&str]) {
    let mut args = vec!["ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all"];
    args.extend(denied);
    let reply = redis.cmd(&args);
    assert_eq!(reply, "OK", "ACL SETUSER {user}: {reply}");
}

fn backend(redis: &RedisServer, user: &str, time: TimeSource) -> Backend {
    support::backend_builder()
        .redis_url(format!("redis://{user}:pw@127.0.0.1:{}", redis.port()))
        .time_source(time)
        .build()
        .expect("backend")
}

#[tokio::test]
async fn a_server_refusing_time_in_scripts_is_told_to_use_the_callers_clock() {
    let redis = RedisServer::start();
    add_user(&redis, "no-time", &["-time"]);

    let error = backend(&redis, "no-time", TimeSource::Server)
        .warm_up()
        .await
        .expect_err("TIME is refused");
    let said = error.to_string();
    assert!(error.is_refusal(), "{said}");
    assert!(said.contains("TIME inside scripts"), "{said}");
    assert!(said.contains("TimeSource::Caller"), "{said}");
    assert!(!said.contains("pw"), "{said}");

    // The remedy works: the caller's clock needs no TIME.
    let backend = backend(&redis, "no-time", TimeSource::Caller);
    backend.warm_up().await.expect("no TIME needed");
    let limiter = PeriodLimiter::new(
        &backend,
        "remedy",
        PeriodConfig::new(2, std::time::Duration::from_secs(60)),
    )
    .expect("valid");
    let decision = limiter.check(b"k", ONE).await;
    assert_eq!(decision.source, Source::Redis, "{decision:?}");
    assert!(decision.is_admitted());
}

/// Checks by a user that may not run a command the engine sends (here `TIME`) fail on
/// every key alike: the breaker opens, so the failure policy answers at once instead of
/// after a round trip per check (the refusal was taken for one key's fault: the backend
/// stayed on Redis).
#[tokio::test]
async fn checks_refused_a_command_open_the_breaker() {
    let redis = RedisServer::start();
    add_user(&redis, "no-time", &["-time"]);
    let backend = support::backend_builder()
        .redis_url(format!("redis://no-time:pw@127.0.0.1:{}", redis.port()))
        .breaker_min_calls(5)
        .build()
        .expect("backend");
    // (A token bucket reads the time on every check; an unaligned fixed window does not.)
    let limiter = TokenBucketLimiter::new(
        &backend,
        "refused",
        TokenBucketConfig::new(100, std::time::Duration::from_secs(60), 100),
    )
    .expect("valid");
    for i in 0..20u32 {
        let key = format!("k{i}");
        let decision = limiter.check(key.as_bytes(), ONE).await;
        assert_ne!(decision.source, Source::Redis, "{decision:?}");
    }
    assert_eq!(backend.redis_switches(), Some(1), "the breaker opened once");
}

#[tokio::test]
async fn a_server_refusing_scripts_is_named_as_such() {
    let redis = RedisServer::start();
    add_user(&redis, "no-scripts", &["-@scripting"]);
    let error = backend(&redis, "no-scripts", TimeSource::Server)
        .warm_up()
        .await
        .expect_err("scripts are refused");
    let said = error.to_string();
    assert!(error.is_refusal(), "{said}");
    assert!(said.contains("Lua scripts"), "{said}");
    assert!(said.contains("in-process"), "{said}");
}

#[tokio::test]
async fn a_server_with_every_right_passes_the_probe_on_both_clocks() {
    let redis = RedisServer::start();
    add_user(&redis, "all", &[]);
    for time in [TimeSource::Server, TimeSource::Caller] {
        backend(&redis, "all", time)
            .warm_up()
            .await
            .unwrap_or_else(|error| panic!("{time:?}: {error}"));
    }
}
