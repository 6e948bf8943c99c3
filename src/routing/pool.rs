//! A pool: its members and their quota buckets' cooldowns, the state the
//! pick and the cooldowns share, built once from the members' specs.

use std::{sync::Arc, time::Duration};

use super::{
    cooldown::{Admission, Cooldowns},
    pick::{self, AffinityKey, MemberSpec},
};
use crate::clock::Clock;

/// One pool's members, each mapped to its quota bucket, and the buckets'
/// cooldowns. Shared by every call to the pool (in an `Arc`); lock-free.
#[derive(Debug)]
pub struct Pool {
    members: Box<[MemberSpec]>,
    bucket_of: Box<[usize]>,
    cooldowns: Cooldowns,
}

impl Pool {
    /// Members naming one `quota` index share a bucket; a member without one
    /// has a bucket of its own.
    pub fn new(members: Vec<MemberSpec>, clock: Arc<dyn Clock>) -> Self {
        let shared = members
            .iter()
            .filter_map(|m| m.quota)
            .max()
            .map_or(0, |q| q + 1);
        let mut own = shared;
        let bucket_of: Box<[usize]> = members
            .iter()
            .map(|member| {
                member.quota.unwrap_or_else(|| {
                    own += 1;
                    own - 1
                })
            })
            .collect();
        Self {
            cooldowns: Cooldowns::new(own, clock),
            members: members.into(),
            bucket_of,
        }
    }

    pub fn members(&self) -> &[MemberSpec] {
        &self.members
    }

    /// The members in the order a call should try them for `key` (see
    /// [`pick::order`]): a member whose bucket is cooling, or that `open`
    /// says is out (its circuit breaker), counts as unusable.
    pub fn order(&self, key: AffinityKey, open: impl Fn(usize) -> bool, out: &mut Vec<usize>) {
        let now = self.cooldowns.now();
        pick::order(
            &self.members,
            |member| !open(member) && !self.cooldowns.is_cooling_at(self.bucket_of[member], now),
            key,
            out,
        );
    }

    /// Asks to send to `member` now (see [`Cooldowns::admit`]); take it only
    /// on `Free` or `Probe`, and report a probe's outcome.
    pub fn admit(&self, member: usize) -> Admission<'_> {
        match self.bucket_of.get(member) {
            Some(&bucket) => self.cooldowns.admit(bucket),
            None => Admission::Cooling,
        }
    }

    /// Whether `member`'s quota bucket is cooling now (its probe out included).
    pub fn is_cooling(&self, member: usize) -> bool {
        self.bucket_of
            .get(member)
            .is_some_and(|&bucket| self.cooldowns.is_cooling(bucket))
    }

    /// The quota bucket `member` cools with.
    pub fn bucket_of(&self, member: usize) -> Option<usize> {
        self.bucket_of.get(member).copied()
    }

    /// Cools `bucket` for `wait`, keeping a later deadline it has: how a
    /// cooldown another instance learned is applied here.
    pub fn cool_bucket(&self, bucket: usize, wait: Duration) {
        self.cooldowns.cool(bucket, wait);
    }

    /// Cools `member`'s quota bucket (every member sharing it) for `wait`.
    pub fn cool(&self, member: usize, wait: Duration) {
        if let Some(&bucket) = self.bucket_of.get(member) {
            self.cooldowns.cool(bucket, wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn members_of_one_quota_cool_together_and_fail_over_in_order() {
        let clock = Arc::new(ManualClock::new(0));
        let members = vec![
            MemberSpec {
                quota: Some(0),
                ..MemberSpec::named("org-a-key-1")
            },
            MemberSpec {
                quota: Some(0),
                ..MemberSpec::named("org-a-key-2")
            },
            MemberSpec::named("org-b"),
        ];
        let pool = Pool::new(members, clock.clone());
        pool.cool(0, Duration::from_secs(10));
        assert!(
            matches!(pool.admit(1), Admission::Cooling),
            "its quota sibling cools too"
        );
        assert!(matches!(pool.admit(2), Admission::Free));
        let mut out = Vec::new();
        pool.order(AffinityKey(42), |_| false, &mut out);
        assert_eq!(out[0], 2, "the one healthy member first");
        pool.order(AffinityKey(42), |m| m == 2, &mut out);
        assert_eq!(out.len(), 3, "every member, usable or not");
        clock.advance(Duration::from_secs(10));
        let Admission::Probe(probe) = pool.admit(1) else {
            panic!("one probe for the bucket");
        };
        assert!(
            matches!(pool.admit(0), Admission::Cooling),
            "one probe for both keys"
        );
        probe.success();
        assert!(matches!(pool.admit(0), Admission::Free));
    }
}
