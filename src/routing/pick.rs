//! The pick: the order in which one call tries a pool's members.
//!
//! Weighted rendezvous hashing (highest random weight): every member draws a
//! score from a hash of (the request's affinity key, the member's name), and
//! the call tries the members best score first. Nothing is shared or stored:
//! every instance computes the same order for the same key, a member that
//! leaves moves only the keys it was first for (every other member's score is
//! unchanged), and a weight `w` wins `w / Σw` of the keys. The order is a
//! walk, not a single choice, so failover is "take the next" (pingora's
//! `BackendSelection::iter`), never a second algorithm.

use std::{hash::BuildHasher, num::NonZeroU32};

use smallvec::SmallVec;

/// What a request is keyed by for stickiness: requests with one key go to one
/// member while it is healthy, so the provider's prompt cache keeps warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffinityKey(pub u64);

impl AffinityKey {
    /// A key of its own for every call: `affinity: none`, spread by weight alone.
    pub fn random() -> Self {
        Self(rand::random())
    }
}

/// A member's identity for hashing: a hash of its *name*, so a member keeps
/// its keys when others are added, removed or listed in another order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberId(u64);

impl MemberId {
    pub fn of_name(name: &str) -> Self {
        Self(stable_hash(name.as_bytes()))
    }
}

/// A pool member as the pick sees it: where it ranks, not how it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpec {
    pub id: MemberId,
    /// Its share of the keys among the members of its tier (`weight: 1` by default).
    pub weight: NonZeroU32,
    /// Lower is tried first; a higher tier only while every lower one is unusable.
    pub priority: u32,
    /// The quota bucket it shares with other members (keys of one organisation
    /// share its limit); `None` is a bucket of its own. An index the caller assigns.
    pub quota: Option<usize>,
}

impl MemberSpec {
    /// A member of weight 1, priority 0 and no shared quota: the defaults.
    pub fn named(name: &str) -> Self {
        Self {
            id: MemberId::of_name(name),
            weight: NonZeroU32::MIN,
            priority: 0,
            quota: None,
        }
    }
}

/// The members' indices in the order a call should try them, into `out`
/// (cleared first): usable members by ascending priority, and within a
/// priority by rendezvous score for `key`; then the unusable ones (cooling,
/// open), in the same order, so a caller that finds every usable member
/// failing can still walk on. No allocation for pools of up to 16 members
/// beyond what `out` already holds.
pub fn order(
    members: &[MemberSpec],
    usable: impl Fn(usize) -> bool,
    key: AffinityKey,
    out: &mut Vec<usize>,
) {
    // One sort key per member, computed once: (unusable, priority), then the
    // score as the bits of a non-negative float (whose order they keep),
    // then the name for a total order if two scores ever tie.
    let ranks: SmallVec<[(u64, u64, u64); 16]> = members
        .iter()
        .enumerate()
        .map(|(index, member)| {
            let tier = (u64::from(!usable(index)) << 32) | u64::from(member.priority);
            (tier, draw(key, member).to_bits(), member.id.0)
        })
        .collect();
    out.clear();
    out.extend(0..members.len());
    out.sort_unstable_by_key(|&index| (ranks[index], index));
}

/// The member's draw for `key`: an exponential variable of rate `weight`,
/// `-ln(u) / weight` with `u` uniform in (0, 1) from the hash of (key, name).
/// The least draw wins, which is the standard logarithmic method (score
/// `-weight / ln(u)`, highest wins) without the division's sign: member `i`
/// wins with probability `weight_i / Σ weight`, and the others keep their
/// relative order whoever leaves.
fn draw(key: AffinityKey, member: &MemberSpec) -> f64 {
    let bits = mix(key.0 ^ member.id.0);
    // 53 bits, centred in their interval: never 0 (ln would be -inf) nor 1.
    let u = ((bits >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    -u.ln() / f64::from(member.weight.get())
}

/// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits
/// whose every output bit depends on every input bit, so the draws of one key
/// for different members, and of one member for different keys, are
/// independent as far as the pick can tell.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The one hasher of names and affinity texts: foldhash's quality hash with
/// a fixed seed, the same in every process of one build (so instances agree
/// on every key). A foldhash release may change it; instances of different
/// builds then disagree on some keys until they all run one, which moves
/// sessions once and loses nothing.
pub(crate) fn hasher() -> foldhash::quality::FoldHasher<'static> {
    foldhash::quality::FixedState::with_seed(0x636f_7272_616c_2e70).build_hasher()
}

fn stable_hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = hasher();
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(name: &str, weight: u32, priority: u32) -> MemberSpec {
        MemberSpec {
            weight: NonZeroU32::new(weight).unwrap(),
            priority,
            ..MemberSpec::named(name)
        }
    }

    fn first(members: &[MemberSpec], key: u64) -> usize {
        let mut out = Vec::new();
        order(members, |_| true, AffinityKey(key), &mut out);
        out[0]
    }

    /// Keys as a caller's would be: well spread, here reproducible.
    fn keys(n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(|i| mix(i.wrapping_add(0x9e37_79b9_7f4a_7c15)))
    }

    #[test]
    fn weights_three_to_one_share_the_keys_three_to_one() {
        let members = [member("a", 3, 0), member("b", 1, 0)];
        let on_a = keys(4000).filter(|&k| first(&members, k) == 0).count();
        // Expected 3000; one standard deviation is ~27 keys, so ±150 is over
        // five of them: a real skew fails, chance does not.
        assert!(
            (2850..=3150).contains(&on_a),
            "{on_a} of 4000 on the weight-3 member"
        );
    }

    #[test]
    fn equal_weights_share_the_keys_evenly() {
        let members: Vec<_> = (0..4).map(|i| member(&format!("m{i}"), 1, 0)).collect();
        let mut counts = [0usize; 4];
        for key in keys(4000) {
            counts[first(&members, key)] += 1;
        }
        // 1000 each, standard deviation ~27.
        assert!(
            counts.iter().all(|c| (860..=1140).contains(c)),
            "{counts:?}"
        );
    }

    #[test]
    fn a_member_that_leaves_moves_only_its_own_keys() {
        let members: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, name)| member(name, 1 + i as u32 % 3, 0))
            .collect();
        let without_c: Vec<_> = members
            .iter()
            .copied()
            .filter(|m| m.id != members[2].id)
            .collect();
        let mut moved = 0;
        for key in keys(4000) {
            let before = members[first(&members, key)].id;
            let after = without_c[first(&without_c, key)].id;
            if before == members[2].id {
                moved += 1;
            } else {
                assert_eq!(before, after, "key {key} moved though its member stayed");
            }
        }
        assert!(moved > 0, "the member that left had keys to move");
    }

    #[test]
    fn a_higher_priority_is_used_only_while_every_lower_one_is_unusable() {
        let members = [
            member("backup", 10, 1),
            member("main-1", 1, 0),
            member("main-2", 1, 0),
        ];
        let mut out = Vec::new();
        for key in keys(200) {
            order(&members, |_| true, AffinityKey(key), &mut out);
            assert_eq!(out[2], 0, "the backup is last while the mains are usable");
            order(&members, |i| i != 1, AffinityKey(key), &mut out);
            assert_eq!(
                out[..2],
                [2, 0],
                "one main cooling: the other, then the backup"
            );
            order(&members, |i| i == 0, AffinityKey(key), &mut out);
            assert_eq!(out[0], 0, "every main cooling: the backup first");
            assert_eq!(
                members[out[1]].priority, 0,
                "then the cooling mains, in order"
            );
        }
    }

    #[test]
    fn unusable_members_come_last_in_their_usual_order() {
        let members: Vec<_> = (0..6).map(|i| member(&format!("m{i}"), 1, i % 2)).collect();
        let mut all = Vec::new();
        let mut some = Vec::new();
        for key in keys(200) {
            order(&members, |_| true, AffinityKey(key), &mut all);
            order(&members, |i| i % 3 != 0, AffinityKey(key), &mut some);
            let usable: Vec<_> = all.iter().copied().filter(|i| i % 3 != 0).collect();
            let unusable: Vec<_> = all.iter().copied().filter(|i| i % 3 == 0).collect();
            assert_eq!(some, [usable, unusable].concat());
        }
    }

    #[test]
    fn affinity_none_spreads_calls_by_weight() {
        let members = [member("a", 1, 0), member("b", 1, 0)];
        let on_a = (0..2000)
            .filter(|_| {
                let mut out = Vec::new();
                order(&members, |_| true, AffinityKey::random(), &mut out);
                out[0] == 0
            })
            .count();
        // Expected 1000, standard deviation ~22: this bound is over 13 of them.
        assert!((700..=1300).contains(&on_a), "{on_a} of 2000");
    }

    fn names() -> impl Strategy<Value = Vec<(String, u32, u32)>> {
        proptest::collection::btree_map("[a-z0-9-]{1,12}", (1u32..5, 0u32..3), 1..12)
            .prop_map(|m| m.into_iter().map(|(n, (w, p))| (n, w, p)).collect())
    }

    proptest! {
        #[test]
        fn the_order_is_every_member_once(spec in names(), key: u64, cooling: u16) {
            let members: Vec<_> = spec.iter().map(|(n, w, p)| member(n, *w, *p)).collect();
            let mut out = Vec::new();
            order(&members, |i| cooling & (1 << i) == 0, AffinityKey(key), &mut out);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..members.len()).collect::<Vec<_>>());
            let tiers: Vec<_> = out
                .iter()
                .map(|&i| (cooling & (1 << i) != 0, members[i].priority))
                .collect();
            prop_assert!(tiers.windows(2).all(|w| w[0] <= w[1]), "{:?}", tiers);
        }

        #[test]
        fn listing_the_members_in_another_order_changes_no_choice(
            spec in names(), key: u64, rotate in 0usize..12,
        ) {
            let members: Vec<_> = spec.iter().map(|(n, w, p)| member(n, *w, *p)).collect();
            let mut shuffled = members.clone();
            shuffled.rotate_left(rotate % members.len());
            shuffled.reverse();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            order(&members, |_| true, AffinityKey(key), &mut a);
            order(&shuffled, |_| true, AffinityKey(key), &mut b);
            let ids = |list: &[MemberSpec], o: &[usize]| o.iter().map(|&i| list[i].id).collect::<Vec<_>>();
            prop_assert_eq!(ids(&members, &a), ids(&shuffled, &b));
        }

        #[test]
        fn removing_a_member_keeps_the_others_in_their_order(
            spec in names(), key: u64, gone in 0usize..12,
        ) {
            let members: Vec<_> = spec.iter().map(|(n, w, p)| member(n, *w, *p)).collect();
            let gone = members[gone % members.len()].id;
            let rest: Vec<_> = members.iter().copied().filter(|m| m.id != gone).collect();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            order(&members, |_| true, AffinityKey(key), &mut a);
            order(&rest, |_| true, AffinityKey(key), &mut b);
            let before: Vec<_> = a.iter().map(|&i| members[i].id).filter(|&id| id != gone).collect();
            let after: Vec<_> = b.iter().map(|&i| rest[i].id).collect();
            prop_assert_eq!(before, after);
        }
    }
}
