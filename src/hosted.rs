//! `hosted_limiter!`: the [`Limiter`](crate::Limiter) of every built-in limiter, a
//! call to the backend's `check` or `operate` per method. Apart from `limiter.rs`, so
//! that the trait and its [`DecisionFuture`](crate::limiter::DecisionFuture) know nothing of the backend,
//! which answers with them.

/// The [`Limiter`](crate::Limiter) of a built-in limiter `$limiter`, whose hosts are in
/// its field `$hosts` (an `Arc` of a [`Hosts`](crate::backend::Hosts) with a `policy`
/// field): every call goes to [`check`](crate::backend::check) or
/// [`operate`](crate::backend::operate). Extra trait items (a token bucket's `reserve`)
/// follow in braces.
macro_rules! hosted_limiter {
    ($limiter:ty, $hosts:ident $(, { $($extra:tt)* })?) => {
        impl $crate::limiter::Limiter for $limiter {
            fn policy(&self) -> &$crate::decision::Policy {
                &self.$hosts.policy
            }

            fn check(&self, key: &[u8], cost: ::std::num::NonZeroU32) -> $crate::limiter::DecisionFuture {
                $crate::backend::check(&self.$hosts, key, cost)
            }

            fn check_priority(
                &self,
                _index: usize,
                key: &[u8],
                cost: ::std::num::NonZeroU32,
                priority: f64,
            ) -> $crate::limiter::DecisionFuture {
                let priority = $crate::decision::Priority::new(priority);
                $crate::backend::check_priority(&self.$hosts, key, cost, priority)
            }

            fn decides_priority(&self) -> bool {
                true
            }

            fn peek(
                &self,
                key: &[u8],
                cost: ::std::num::NonZeroU32,
            ) -> Option<$crate::limiter::DecisionFuture> {
                let op = $crate::backend::Operation::Peek;
                Some($crate::backend::operate(&self.$hosts, op, key, u64::from(cost.get())))
            }

            fn refund(
                &self,
                key: &[u8],
                cost: ::std::num::NonZeroU32,
            ) -> Option<$crate::limiter::DecisionFuture> {
                let op = $crate::backend::Operation::Refund;
                Some($crate::backend::operate(&self.$hosts, op, key, u64::from(cost.get())))
            }

            fn settle(&self, key: &[u8], delta: i64) -> Option<$crate::limiter::DecisionFuture> {
                // A cost is at most `u32::MAX` units, either way.
                let most = i64::from(u32::MAX);
                let op = $crate::backend::Operation::Settle {
                    delta: delta.clamp(-most, most),
                };
                Some($crate::backend::operate(&self.$hosts, op, key, 0))
            }

            fn reset(&self, key: &[u8]) -> Option<$crate::limiter::DecisionFuture> {
                let op = $crate::backend::Operation::Reset;
                Some($crate::backend::operate(&self.$hosts, op, key, 0))
            }

            fn block(
                &self,
                key: &[u8],
                duration: ::std::time::Duration,
            ) -> Option<$crate::limiter::DecisionFuture> {
                let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1);
                let op = $crate::backend::Operation::Block;
                Some($crate::backend::operate(&self.$hosts, op, key, ms))
            }

            fn unblock(&self, key: &[u8]) -> Option<$crate::limiter::DecisionFuture> {
                let op = $crate::backend::Operation::Unblock;
                Some($crate::backend::operate(&self.$hosts, op, key, 0))
            }

            fn blocked(&self, max: usize) -> Option<$crate::blocked::Listing> {
                let name = self.$hosts.policy.name();
                Some($crate::backend::list_blocked(&self.$hosts, name, max))
            }

            $($($extra)*)?
        }
    };
}
pub(crate) use hosted_limiter;
