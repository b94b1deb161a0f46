//! Choosing an algorithm: the fixed window, the token bucket, the rolling window, or plans.
//!
//! # Choosing an algorithm
//!
//! | you want | use | because |
//! |---|---|---|
//! | a quota per calendar period ("1000 per day, reset at midnight") | [`PeriodLimitLayer`](crate::PeriodLimitLayer) with a [`calendar`](crate::PeriodConfig::calendar) (a day, week or month in an IANA zone) or [`align`](crate::PeriodConfig::align) (a fixed UTC offset) | one counter per key; windows end at fixed times everybody can predict |
//! | an API rate that tolerates short bursts | [`TokenBucketLayer`](crate::TokenBucketLayer) | smooth: a steady `rate` with up to `burst` at once; weighted costs |
//! | "at most N in any minute", no matter when the minute starts | [`RollingWindowLayer`](crate::RollingWindowLayer) | no doubling at window edges, at the cost of one counter per bucket |
//! | several limits on one route | one layer each, [stacked](crate::guide::stacking#stacked-limits) | each limit keeps its own algorithm and key |
//! | a limit per plan or tier | [`Plans`](crate::Plans) | one layer, the limit chosen per request |
//!
//! The fixed window is the cheapest and the easiest to explain, but a client can spend
//! its quota at the end of one window and again at the start of the next: twice the
//! quota within moments. When that matters, use the token bucket (which spreads
//! requests out) or the rolling window (which counts any window of the same length).
//! Every algorithm counts only admitted requests, so a refused request never makes a
//! client wait longer.
