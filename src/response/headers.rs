//! The IETF `RateLimit` and `RateLimit-Policy` headers (and `Retry-After`), added to
//! every answer, one list item per stacked policy.

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::HeaderMap;

use super::rejection::ceil_secs;
use crate::decision::{Decision, Policy, Source};

/// The `RateLimit` header (IETF draft-ietf-httpapi-ratelimit-headers-10).
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` header (IETF draft-ietf-httpapi-ratelimit-headers-10).
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The size of each buffer a thread writes its `RateLimit` values into.
const VALUES_CAPACITY: usize = 4096;

thread_local! {
    /// Where this thread writes `RateLimit` values. Each value is split off as a `Bytes`
    /// sharing the buffer (counted by reference), so writing one allocates nothing: once
    /// the values written before are all dropped (their responses sent), the buffer is
    /// reused from its start; while some are still held, the next value goes into a new
    /// buffer of [`VALUES_CAPACITY`] bytes, and the old one is freed with the last value
    /// in it. A value held for long keeps at most its buffer alive.
    static VALUES: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(VALUES_CAPACITY));
}

/// The `RateLimit-Policy` value of a policy; built once per layer.
pub(crate) fn policy_header(policy: &Policy) -> HeaderValue {
    policy_value(policy, policy.quota())
}

/// The `RateLimit-Policy` value of `policy` with a quota of `quota`.
fn policy_value(policy: &Policy, quota: u64) -> HeaderValue {
    let mut buf = itoa::Buffer::new();
    let mut v = String::with_capacity(policy.name().len() + 24);
    v.push('"');
    v.push_str(policy.name());
    v.push_str("\";q=");
    v.push_str(buf.format(quota));
    v.push_str(";w=");
    v.push_str(buf.format(ceil_secs(policy.window()).max(1)));
    HeaderValue::try_from(v).expect("policy names are checked when the layer is built")
}

/// Pre-built pieces of the per-response headers of one policy.
#[derive(Debug, Clone)]
pub(crate) struct HeaderParts {
    /// The policy, for a decision under another limit than its quota (the fallback's
    /// share of it).
    of: Policy,
    policy: HeaderValue,
    /// `"name";r=`
    ratelimit_prefix: Bytes,
}

impl HeaderParts {
    pub(crate) fn new(policy: &Policy) -> Self {
        let mut prefix = BytesMut::with_capacity(policy.name().len() + 5);
        prefix.put_u8(b'"');
        prefix.put_slice(policy.name().as_bytes());
        prefix.put_slice(b"\";r=");
        Self {
            of: policy.clone(),
            policy: policy_header(policy),
            ratelimit_prefix: prefix.freeze(),
        }
    }

    /// This policy's item of the `RateLimit` header: `"name";r=<remaining>;t=<reset>`,
    /// written into this thread's buffer of header values ([`VALUES`]).
    pub(crate) fn ratelimit_value(&self, decision: &Decision) -> Bytes {
        let mut remaining = itoa::Buffer::new();
        let remaining = remaining.format(decision.remaining).as_bytes();
        let mut reset = itoa::Buffer::new();
        let reset = reset.format(ceil_secs(decision.reset)).as_bytes();
        let parts: [&[u8]; 4] = [&self.ratelimit_prefix, remaining, b";t=", reset];
        let written = VALUES.try_with(|values| {
            let mut values = values.try_borrow_mut().ok()?;
            values.reserve(parts.iter().map(|part| part.len()).sum());
            for part in parts {
                values.extend_from_slice(part);
            }
            Some(values.split().freeze())
        });
        match written {
            Ok(Some(value)) => value,
            // Only while this thread exits (or if this were reentered): an allocation of
            // its own.
            _ => Bytes::from(parts.concat()),
        }
    }

    /// Appends this policy's item of the `RateLimit` header to `out`.
    pub(crate) fn write_ratelimit_value(&self, decision: &Decision, out: &mut Vec<u8>) {
        let mut num = itoa::Buffer::new();
        out.extend_from_slice(&self.ratelimit_prefix);
        out.extend_from_slice(num.format(decision.remaining).as_bytes());
        out.extend_from_slice(b";t=");
        out.extend_from_slice(num.format(ceil_secs(decision.reset)).as_bytes());
    }

    /// The policy these parts are of.
    pub(crate) fn policy(&self) -> &Policy {
        &self.of
    }

    /// This policy's `RateLimit-Policy` item.
    pub(crate) fn policy_value(&self) -> &HeaderValue {
        &self.policy
    }

    /// This policy's `RateLimit-Policy` item for `decision`: its quota the limit the
    /// decision applied when that is not the policy's (the fallback's share of it while
    /// Redis is unreachable: the header says what is enforced).
    pub(crate) fn policy_for(&self, decision: &Decision) -> HeaderValue {
        if decision.source == Source::Fallback && decision.limit != self.of.quota() {
            policy_value(&self.of, decision.limit)
        } else {
            self.policy.clone()
        }
    }

    /// The `RateLimit-Policy` and `RateLimit` values of `decision` under this policy,
    /// built once: an admitted request's are built before the inner service runs and
    /// added to its response ([`Ready::apply`]).
    pub(crate) fn ready(&self, decision: &Decision) -> Ready {
        let policy = match &decision.policy_header {
            Some(policy) => policy.clone(),
            None => self.policy_for(decision),
        };
        let ratelimit = match &decision.ratelimit_header {
            Some(value) => HeaderValue::from_maybe_shared(value.0.clone()).ok(),
            None => HeaderValue::from_maybe_shared(self.ratelimit_value(decision)).ok(),
        };
        Ready { policy, ratelimit }
    }

    /// Adds this policy to `RateLimit-Policy` and `RateLimit` (and `Retry-After` for a
    /// rejection that can be retried). Values already there (from inner layers, a
    /// handler, or a custom rejection) are kept: this policy goes first in the list, so
    /// stacked layers read outermost first.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, decision: &Decision) {
        self.ready(decision).apply(headers);
        if let Some(retry) = decision.retry_after {
            if !decision.is_admitted() {
                let secs = ceil_secs(retry).max(1);
                let new = HeaderValue::from(secs);
                // Stacked limits: the longest wait wins.
                let keep = headers
                    .get(header::RETRY_AFTER)
                    .and_then(|old| old.to_str().ok()?.parse::<u64>().ok())
                    .is_some_and(|old| old >= secs);
                if !keep {
                    headers.insert(header::RETRY_AFTER, new);
                }
            }
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` values of one decision, ready to be added to
/// a response ([`HeaderParts::ready`]).
#[derive(Debug, Clone)]
pub(crate) struct Ready {
    policy: HeaderValue,
    /// `None` only if the value were not a valid header value (never in practice).
    ratelimit: Option<HeaderValue>,
}

impl Ready {
    /// Puts these values first in `RateLimit-Policy` and `RateLimit`, keeping the
    /// values already there after them.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        prepend(headers, RATELIMIT_POLICY, self.policy);
        if let Some(value) = self.ratelimit {
            prepend(headers, RATELIMIT, value);
        }
    }
}

/// Puts `value` first in the list header `name`: one field line holding `value` and
/// then every value already there, comma-separated (one list, as RFC 9110 reads several
/// lines of a list header, but one line for clients that read only the first).
fn prepend(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    match headers.entry(name) {
        header::Entry::Vacant(entry) => {
            entry.insert(value);
        }
        header::Entry::Occupied(mut entry) => {
            let len = entry.iter().map(|v| v.len() + 2).sum::<usize>();
            let mut joined = BytesMut::with_capacity(value.len() + len);
            joined.put_slice(value.as_bytes());
            for old in entry.iter() {
                joined.put_slice(b", ");
                joined.put_slice(old.as_bytes());
            }
            if let Ok(joined) = HeaderValue::from_maybe_shared(joined.freeze()) {
                entry.insert(joined);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::decision::{Source, State};

    fn decision(state: State, remaining: u64, reset_ms: u64) -> Decision {
        Decision::new(
            state,
            5,
            remaining,
            Duration::from_millis(reset_ms),
            Source::InProcess,
        )
    }

    #[test]
    fn draft_ten_header_format() {
        let policy = Policy::new("sms", 5, Duration::from_secs(86_400));
        let parts = HeaderParts::new(&policy);
        let mut headers = HeaderMap::new();
        parts.apply(&mut headers, &decision(State::Allowed, 3, 1_500));
        assert_eq!(headers[RATELIMIT_POLICY], "\"sms\";q=5;w=86400");
        assert_eq!(headers[RATELIMIT], "\"sms\";r=3;t=2");
        assert!(headers.get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn values_written_later_never_change_earlier_ones() {
        let parts = HeaderParts::new(&Policy::new("api", 1_000_000, Duration::from_secs(1)));
        let value = |i: u64| parts.ratelimit_value(&decision(State::Allowed, i, i * 1_000));
        let expected = |i: u64| format!("\"api\";r={};t={i}", i.min(5));
        // Held: far more than one buffer's worth, so later values go to new buffers.
        let held: Vec<(u64, Bytes)> = (0..2_000).map(|i| (i, value(i))).collect();
        for (i, v) in &held {
            assert_eq!(v, expected(*i).as_bytes());
        }
        drop(held);
        // Dropped one by one: the buffer is reused from its start.
        for i in 0..2_000 {
            assert_eq!(value(i), expected(i).as_bytes());
        }
        // On other threads, each with its own buffer.
        let parts = std::sync::Arc::new(parts);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let parts = std::sync::Arc::clone(&parts);
                std::thread::spawn(move || {
                    (0..500)
                        .map(|i| parts.ratelimit_value(&decision(State::Allowed, i, i * 1_000)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            for (i, v) in thread.join().unwrap().into_iter().enumerate() {
                assert_eq!(v, expected(i as u64).as_bytes());
            }
        }
    }

    #[test]
    fn retry_after_rounds_up_and_keeps_the_longest() {
        let policy = Policy::new("p", 5, Duration::from_millis(300));
        let parts = HeaderParts::new(&policy);
        assert_eq!(policy_header(&policy), "\"p\";q=5;w=1");
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, HeaderValue::from(7u64));
        let d = decision(State::OverQuota, 0, 200).with_retry_after(Duration::from_millis(200));
        parts.apply(&mut headers, &d);
        assert_eq!(headers[header::RETRY_AFTER], "7");
        let mut headers = HeaderMap::new();
        parts.apply(&mut headers, &d);
        assert_eq!(headers[header::RETRY_AFTER], "1");
        assert_eq!(headers[RATELIMIT], "\"p\";r=0;t=1");
    }

    #[test]
    fn stacked_policies_share_one_list_outermost_first() {
        let burst = HeaderParts::new(&Policy::new("burst", 10, Duration::from_secs(1)));
        let daily = HeaderParts::new(&Policy::new("daily", 1_000, Duration::from_secs(86_400)));
        let mut headers = HeaderMap::new();
        // The inner layer (daily) decorates first, then the outer one (burst).
        daily.apply(&mut headers, &decision(State::Allowed, 998, 51_840_000));
        burst.apply(&mut headers, &decision(State::Allowed, 9, 1_000));
        assert_eq!(headers.get_all(RATELIMIT_POLICY).iter().count(), 1);
        assert_eq!(
            headers[RATELIMIT_POLICY],
            "\"burst\";q=10;w=1, \"daily\";q=1000;w=86400"
        );
        assert_eq!(
            headers[RATELIMIT],
            "\"burst\";r=5;t=1, \"daily\";r=5;t=51840"
        );
    }
}
