//! Deciding: a check's journey ([`check`](check::check())) and the handles' other
//! operations ([`operate`](operate::operate())), on each algorithm's two hosts
//! ([`Hosts`](hosts::Hosts): its Lua in the engine, its in-process state), with the
//! pieces they share: the engine's text and its calls, the deny cache, coalescing and
//! batching, leases, blocks and their listing, the failure policy, and the Redis key
//! layout.
//!
//! The wire format between the Rust and the engine's Lua is [`protocol`], on one page.
//!
//! This module uses the Redis connection ([`backend::redis`](super::redis)) to send its
//! calls; the connection knows nothing of it.

pub(crate) mod batch;
pub(crate) mod block;
pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod coalesce;
pub(crate) mod deny;
pub(crate) mod engine;
pub(crate) mod hosts;
pub(crate) mod layout;
pub(crate) mod lease;
pub(crate) mod leased;
pub(crate) mod listing;
pub(crate) mod operate;
pub(crate) mod policy;
pub(crate) mod protocol;
pub(crate) mod queued;
pub(crate) mod reply;
