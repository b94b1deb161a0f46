//! The in-process host of the in-flight slots, and the layer on it.

use std::time::Duration;

use super::*;
use crate::decision::{Source, State};
use crate::{InFlightConfig, LimitLayer};

fn limiter(slots: u64) -> InFlightLimiter {
    InFlightLimiter::new(&Backend::in_process(), "t", InFlightConfig::new(slots)).unwrap()
}

#[tokio::test]
async fn slots_are_taken_up_to_the_limit_and_given_back_on_drop() {
    let limiter = limiter(2);
    let a = limiter.acquire(b"k").await.unwrap();
    assert_eq!(a.decision().state, State::Allowed);
    assert_eq!(a.decision().remaining, 1);
    assert_eq!(a.decision().source, Source::InProcess);
    let b = limiter.acquire(b"k").await.unwrap();
    assert_eq!(b.decision().state, State::HitQuota);
    let refused = limiter.acquire(b"k").await.unwrap_err();
    assert_eq!(refused.state, State::OverQuota);
    assert_eq!(refused.retry_after, Some(DEFAULT_RETRY_AFTER));
    // Another key has slots of its own.
    let other = limiter.acquire(b"other").await.unwrap();
    assert_eq!(limiter.in_flight(b"k").await, 2);
    drop(a);
    assert_eq!(limiter.in_flight(b"k").await, 1);
    let c = limiter.acquire(b"k").await.unwrap();
    drop((b, c, other));
    assert_eq!(limiter.in_flight(b"k").await, 0);
    // Keys without slots are not kept.
    assert!(limiter.slots.local_is_empty());
}

#[tokio::test]
async fn limiters_of_one_name_share_their_slots() {
    let backend = Backend::in_process();
    let one = InFlightLimiter::new(&backend, "n", InFlightConfig::new(1)).unwrap();
    let two = InFlightLimiter::new(&backend, "n", InFlightConfig::new(1)).unwrap();
    let other = InFlightLimiter::new(&backend, "m", InFlightConfig::new(1)).unwrap();
    let _slot = one.acquire(b"k").await.unwrap();
    assert!(two.acquire(b"k").await.is_err());
    assert!(other.acquire(b"k").await.is_ok());
}

#[test]
fn invalid_settings_fail_when_built() {
    let backend = Backend::in_process();
    let err = |config| InFlightLimiter::new(&backend, "x", config).unwrap_err();
    assert_eq!(
        err(InFlightConfig::new(0)),
        ConfigError::Zero { setting: "slots" }
    );
    assert_eq!(
        err(InFlightConfig::new(1).slot_ttl(Duration::ZERO)),
        ConfigError::ZeroDuration {
            setting: "slot_ttl"
        }
    );
    assert_eq!(
        err(InFlightConfig::new(1).slot_ttl(Duration::from_micros(999))),
        ConfigError::ZeroDuration {
            setting: "slot_ttl"
        }
    );
    assert_eq!(
        err(InFlightConfig::new(1).retry_after(Duration::ZERO)),
        ConfigError::ZeroDuration {
            setting: "retry_after"
        }
    );
    let layer = |builder: crate::LayerBuilder<InFlightConfig>| builder.build().unwrap_err();
    assert_eq!(
        layer(LimitLayer::builder(&backend, InFlightConfig::new(1))),
        ConfigError::Missing { setting: "name" }
    );
    assert_eq!(
        layer(LimitLayer::builder(&backend, InFlightConfig::new(0)).name("a")),
        ConfigError::Zero { setting: "slots" }
    );
    assert_eq!(
        layer(
            LimitLayer::builder(&backend, InFlightConfig::new(1).slot_ttl(Duration::ZERO))
                .name("a")
        ),
        ConfigError::ZeroDuration {
            setting: "slot_ttl"
        }
    );
}
