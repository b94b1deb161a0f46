//! How a set decides: its members' hosts asked together, on Redis in one call of the
//! engine, in process under one lock per key, and their decisions combined into the
//! set's one decision with every member in the headers.

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use http::HeaderValue;

use crate::backend::{Args, Blocks, Call, Hosts, Remote};
use crate::decision::{Decision, Policy, Priority, RateLimitValue, Source, State};
use crate::response::HeaderParts;

/// Locks of the in-process set checks: one is taken per check, by key.
pub(super) const LOCKS: usize = 64;

/// A set's members, its headers and blocks, and the locks of its in-process checks.
pub(super) struct SetHosts {
    pub(super) members: Box<[Arc<dyn Hosts>]>,
    /// Per member: whether it counts requests (one each) rather than cost.
    pub(super) per_request: Box<[bool]>,
    /// Each member's header pieces, in order.
    pub(super) headers: Box<[HeaderParts]>,
    /// Each member's policy, in order.
    pub(super) limits: Box<[Policy]>,
    /// The members' policies: the first one is the set's (for metrics, under the set's
    /// name).
    pub(super) policy: Policy,
    /// Every member's `RateLimit-Policy` item, in order.
    pub(super) policy_header: HeaderValue,
    /// Room for the `RateLimit` value with every member's largest numbers.
    pub(super) ratelimit_capacity: usize,
    pub(super) capacity: u64,
    /// The policy of the member with the smallest capacity (the first of them).
    pub(super) smallest: Policy,
    pub(super) locks: Box<[Mutex<()>]>,
    pub(super) hasher: std::collections::hash_map::RandomState,
    /// The set's blocked keys and lockout (its members have none of their own).
    pub(super) blocks: Blocks,
}

impl std::fmt::Debug for SetHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetHosts")
            .field("policy", &self.policy)
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl SetHosts {
    /// One decision from the members': the admitting one with the least left when all
    /// admit, else the refusing one with the longest wait; with every member in the
    /// headers.
    fn combine(&self, decisions: &[Decision]) -> Decision {
        let chosen = if decisions.iter().all(Decision::is_admitted) {
            decisions
                .iter()
                .enumerate()
                .min_by_key(|(_, d)| d.remaining)
        } else {
            // The longest wait; on a tie, the first limit (`rev`: `max_by_key` keeps the last).
            decisions
                .iter()
                .enumerate()
                .filter(|(_, d)| !d.is_admitted())
                .rev()
                .max_by_key(|(_, d)| d.retry_after)
        };
        let (index, chosen) = chosen.expect("a set has at least one limit");
        let mut decision = chosen.clone();
        if !decision.is_admitted() {
            decision.rejected_by = u8::try_from(index).ok();
        }
        decision.ratelimit_header = Some(self.ratelimit_value(decisions.iter()));
        // During the fallback each member's quota is the share in force.
        decision.policy_header = Some(if decisions.iter().any(|d| d.source == Source::Fallback) {
            let items = self
                .headers
                .iter()
                .zip(decisions)
                .map(|(h, d)| h.policy_for(d));
            let items: Vec<HeaderValue> = items.collect();
            join(items.iter().map(HeaderValue::as_bytes))
        } else {
            self.policy_header.clone()
        });
        decision
    }

    /// The set's decision for a key blocked for `wait` more: the one its limits'
    /// `decisions` give (as [`combine`](Self::combine)), blocked, with every limit in
    /// the headers blocked too (no units left until the block's end at least).
    fn combine_blocked(&self, decisions: &[Decision], wait: Duration) -> Decision {
        let mut decision = self.combine(decisions).blocked(wait);
        // Refused by the set's block, whatever its limits say.
        decision.rejected_by = None;
        let blocked = decisions.iter().map(|d| d.clone().blocked(wait));
        decision.ratelimit_header = Some(self.ratelimit_value(blocked));
        decision
    }

    /// Every member's item of the `RateLimit` header, in one allocation.
    fn ratelimit_value<D: std::borrow::Borrow<Decision>>(
        &self,
        decisions: impl Iterator<Item = D>,
    ) -> RateLimitValue {
        let mut value = Vec::with_capacity(self.ratelimit_capacity);
        for (i, (parts, d)) in self.headers.iter().zip(decisions).enumerate() {
            if i > 0 {
                value.extend_from_slice(b", ");
            }
            parts.write_ratelimit_value(d.borrow(), &mut value);
        }
        RateLimitValue(bytes::Bytes::from(value))
    }

    /// Each limit's decision in the engine's reply (its limits' parts, in order).
    fn split(&self, reply: &[i64], cost: NonZeroU32) -> Option<Vec<Decision>> {
        if reply.len() != self.reply_len() {
            return None;
        }
        let mut rest = reply;
        let mut decisions = Vec::with_capacity(self.members.len());
        for member in self.members.iter() {
            let (part, tail) = rest.split_at(member.reply_len());
            decisions.push(member.decide(part, cost)?);
            rest = tail;
        }
        Some(decisions)
    }

    /// What member `i` spends of a request's cost: the cost, or one for a member that
    /// counts requests (none for a cost of 0), as the engine's `units`.
    fn units(&self, i: usize, cost: u32) -> u32 {
        if self.per_request[i] {
            cost.min(1)
        } else {
            cost
        }
    }

    fn lock(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ()> {
        let index = (self.hasher.hash_one(key) % LOCKS as u64) as usize;
        // A panic while holding a set lock leaves no state half-written (each member's
        // change is one step): carry on.
        self.locks[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Hosts for SetHosts {
    fn remote(&self) -> &Remote {
        self.members[0].remote()
    }

    fn blocks(&self) -> &Blocks {
        &self.blocks
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        let decisions: Vec<_> = self
            .members
            .iter()
            .zip(self.per_request.iter())
            .map(|(m, &per_request)| {
                if m.capacity() == self.capacity && !per_request {
                    m.exceeds_capacity(source)
                } else {
                    Decision::new(
                        State::Allowed,
                        m.capacity(),
                        m.capacity(),
                        Duration::ZERO,
                        source,
                    )
                }
            })
            .collect();
        self.combine(&decisions)
    }

    fn limit_count(&self) -> usize {
        self.members.len()
    }

    fn extra_keys(&self, key: &[u8], call: &mut Call) {
        for member in &self.members[1..] {
            member.remote().add_redis_key(key, call);
        }
    }

    fn limit_args(&self, args: &mut Args) {
        for (member, &per_request) in self.members.iter().zip(self.per_request.iter()) {
            let letter = args.len();
            member.limit_args(args);
            if per_request {
                // A member that counts requests: its letter in capitals.
                args.capitalize(letter);
            }
        }
    }

    fn window_args(&self, now_ms: i64, call: &mut Call) {
        for member in self.members.iter() {
            member.window_args(now_ms, call);
        }
    }

    fn reply_len(&self) -> usize {
        self.members.iter().map(|m| m.reply_len()).sum()
    }

    fn decide(&self, reply: &[i64], cost: NonZeroU32) -> Option<Decision> {
        Some(self.combine(&self.split(reply, cost)?))
    }

    fn decide_blocked(&self, reply: &[i64], cost: NonZeroU32, wait: Duration) -> Option<Decision> {
        Some(self.combine_blocked(&self.split(reply, cost)?, wait))
    }

    fn combine_members_blocked(&self, members: &[Decision], wait: Duration) -> Option<Decision> {
        (members.len() == self.members.len()).then(|| self.combine_blocked(members, wait))
    }

    fn local_blocked(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        wait: Duration,
    ) -> Decision {
        let _guard = self.lock(key);
        // What the set's check would say, spending nothing: its refusal if a limit would
        // refuse (the refusing limits as they refuse, the others where they stand), else
        // where every limit stands.
        let mut members: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| m.local_priority(key, self.units(i, cost), priority, source, false))
            .collect();
        let admitted = members.iter().all(Decision::is_admitted);
        for (member, decision) in self.members.iter().zip(&mut members) {
            if admitted || decision.is_admitted() {
                *decision = member.local(key, 0, source, false);
            }
        }
        self.combine_blocked(&members, wait)
    }

    fn member_decisions(&self, reply: &[i64], cost: NonZeroU32) -> Option<Arc<[Decision]>> {
        self.split(reply, cost).map(Arc::from)
    }

    fn combine_members(&self, members: &[Decision]) -> Option<Decision> {
        (members.len() == self.members.len()).then(|| self.combine(members))
    }

    fn local_priority(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        spend: bool,
    ) -> Decision {
        let _guard = self.lock(key);
        let mut decisions: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| m.local_priority(key, self.units(i, cost), priority, source, false))
            .collect();
        let admitted = decisions.iter().all(Decision::is_admitted);
        for (i, (member, decision)) in self.members.iter().zip(&mut decisions).enumerate() {
            if admitted && spend {
                *decision = member.local_priority(key, self.units(i, cost), priority, source, true);
            } else if !admitted && decision.is_admitted() {
                // Refused by another limit: this one stands where it was.
                *decision = member.local_priority(key, 0, priority, source, false);
            }
        }
        self.combine(&decisions)
    }

    fn keeps(&self, priority: Priority) -> Vec<u64> {
        let keeps = self.members.iter().map(|m| priority.keep(m.capacity()));
        keeps.collect()
    }

    fn decide_priority(
        &self,
        reply: &[i64],
        cost: NonZeroU32,
        priority: Priority,
    ) -> Option<Decision> {
        let decisions: Vec<_> = (self.split(reply, cost)?.into_iter())
            .zip(self.members.iter())
            .map(|(decision, member)| decision.keeping(priority.keep(member.capacity())))
            .collect();
        Some(self.combine(&decisions))
    }

    fn local_refund(&self, key: &[u8], cost: u32) {
        let _guard = self.lock(key);
        for (i, member) in self.members.iter().enumerate() {
            member.local_refund(key, self.units(i, cost));
        }
    }

    fn local_charge(&self, key: &[u8], cost: u64) {
        self.local_settle(key, i64::try_from(cost).unwrap_or(i64::MAX));
    }

    /// Settles the members that count cost; those that count requests are left alone.
    fn local_settle(&self, key: &[u8], delta: i64) {
        let _guard = self.lock(key);
        for (member, &per_request) in self.members.iter().zip(self.per_request.iter()) {
            if !per_request {
                member.local_settle(key, delta);
            }
        }
    }

    fn local_reset(&self, key: &[u8]) {
        let _guard = self.lock(key);
        for member in self.members.iter() {
            member.local_reset(key);
        }
    }

    fn local_members(&self, key: &[u8], cost: u32, source: Source) -> Option<Vec<Decision>> {
        let backend = self.remote().backend();
        let now_us = || backend.clock().now_us();
        let until = self.blocks.until(&backend.local_store(), key, now_us);
        let _guard = self.lock(key);
        let mut decided: Vec<Decision> = (self.members.iter().enumerate())
            .map(|(i, member)| member.local(key, self.units(i, cost), source, false))
            .collect();
        if decided.iter().any(|d| !d.is_admitted()) {
            // As the engine answers a set's refusal: the members that would admit say
            // where they stand (a cost of 0).
            for (member, decision) in self.members.iter().zip(decided.iter_mut()) {
                if decision.is_admitted() {
                    *decision = member.local(key, 0, source, false);
                }
            }
        }
        let each = decided.into_iter().map(|decision| match until {
            Some(until) => decision.blocked(Duration::from_micros(until.saturating_sub(now_us()))),
            None => decision,
        });
        Some(each.collect())
    }
}

/// `items` as one comma-separated header value.
pub(super) fn join<'a>(items: impl Iterator<Item = &'a [u8]>) -> HeaderValue {
    let mut v = BytesMut::new();
    for item in items {
        if !v.is_empty() {
            v.put_slice(b", ");
        }
        v.put_slice(item);
    }
    HeaderValue::from_maybe_shared(v.freeze()).expect("made of valid header values")
}
