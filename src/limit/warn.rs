//! The warning about requests refused for a missing key: once per interval per layer,
//! with a count of the ones not logged, for one atomic load on the common path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a layer logs requests it refused for a missing key, at most: one `warn`
/// line per interval, which counts the refusals since the previous line.
pub(crate) const MISSING_KEY_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// When a layer may next warn about a missing key, and how many refusals were not
/// logged since it last did.
#[derive(Debug)]
pub(crate) struct MissingKeyWarning {
    start: Instant,
    /// Milliseconds after `start` from which the next warning may be logged.
    next_ms: AtomicU64,
    /// Refusals since the last warning that were not logged.
    suppressed: AtomicU64,
    /// The key extractor's type, without module paths.
    extractor: Box<str>,
}

impl MissingKeyWarning {
    pub(crate) fn new(extractor: &str) -> Self {
        Self {
            start: Instant::now(),
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            extractor: short_type_name(extractor).into(),
        }
    }

    /// The extractor's short type name, e.g. `Or<HeaderKey, PeerIp>`.
    pub(crate) fn extractor(&self) -> &str {
        &self.extractor
    }

    /// Whether to log now: `Some(refusals not logged since the last line)` at most once
    /// per interval, `None` (and one more refusal counted) otherwise.
    pub(crate) fn due(&self) -> Option<u64> {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.due_at(now)
    }

    fn due_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let interval = MISSING_KEY_WARNING_INTERVAL.as_millis() as u64;
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `name` without module paths: `a::b::Or<a::c::HeaderKey, a::c::PeerIp>` becomes
/// `Or<HeaderKey, PeerIp>`.
fn short_type_name(name: &str) -> String {
    let mut short = String::with_capacity(name.len());
    let mut segment = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            segment.clear();
        } else if c.is_alphanumeric() || c == '_' || c == '{' || c == '}' {
            segment.push(c);
        } else {
            short.push_str(&segment);
            segment.clear();
            short.push(c);
        }
    }
    short.push_str(&segment);
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_rest() {
        let warning = MissingKeyWarning::new("x::Y");
        let interval = MISSING_KEY_WARNING_INTERVAL.as_millis() as u64;
        assert_eq!(warning.due_at(5), Some(0));
        for t in 6..106 {
            assert_eq!(warning.due_at(t), None);
        }
        assert_eq!(warning.due_at(5 + interval - 1), None);
        assert_eq!(warning.due_at(5 + interval), Some(101));
        assert_eq!(warning.due_at(5 + interval + 1), None);
    }

    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(
            short_type_name(
                "tower_redis_ratelimit::key::combine::Or<tower_redis_ratelimit::key::request::HeaderKey, tower_redis_ratelimit::key::address::PeerIp>"
            ),
            "Or<HeaderKey, PeerIp>"
        );
        assert_eq!(
            short_type_name("tower_redis_ratelimit::key::request::ExtensionKey<app::UserId>"),
            "ExtensionKey<UserId>"
        );
        assert_eq!(short_type_name("tests::main::{{closure}}"), "{{closure}}");
    }
}
