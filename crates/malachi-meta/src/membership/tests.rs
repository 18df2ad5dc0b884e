use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

const SESSION_MS: u64 = 30_000;
const MEMBERS_MAX: u32 = 8;

fn ranges(ids: &[u32]) -> BTreeSet<u32> {
    ids.iter().copied().collect()
}

fn now(now_ms: u64, readable: &BTreeSet<u32>) -> Now<'_> {
    Now { now_ms, session_ms: SESSION_MS, readable }
}

/// A member's side: what it was last told, and whether it applied it.
fn beat(group: &mut Membership, member: &str, applied: Option<u64>, at: Now<'_>) -> Told {
    group.heartbeat(member, applied, at, MEMBERS_MAX).expect("heartbeat")
}

/// A range leaves its reader before another member gets it: the joiner gets nothing the first
/// member still reads until that member applied the generation that took it away.
#[test]
fn a_range_moves_only_after_its_reader_let_go() {
    let readable = ranges(&[1, 2, 3, 4]);
    let mut group = Membership::default();
    let a = beat(&mut group, "a", None, now(0, &readable));
    assert_eq!(a.ranges, ranges(&[1, 2, 3, 4]));
    let b = beat(&mut group, "b", None, now(10, &readable));
    assert_eq!(b.ranges, ranges(&[]), "a still reads everything");
    let a = beat(&mut group, "a", Some(a.generation), now(20, &readable));
    assert_eq!(a.ranges, ranges(&[1, 2]), "a is told to give up 3 and 4");
    let b = beat(&mut group, "b", Some(b.generation), now(30, &readable));
    assert_eq!(b.ranges, ranges(&[]), "a has not applied it yet");
    assert_eq!(
        group.may_commit("b", Some(b.generation), 3),
        Err(MembershipError::NotOwner { member: "b".into(), range_id: 3 })
    );
    assert_eq!(group.may_commit("a", None, 3), Ok(()), "a may still commit what it read");
    let a = beat(&mut group, "a", Some(a.generation), now(40, &readable));
    assert_eq!(a.ranges, ranges(&[1, 2]));
    let b = beat(&mut group, "b", Some(b.generation), now(50, &readable));
    assert_eq!(b.ranges, ranges(&[3, 4]), "now b reads them");
    assert!(group.may_commit("a", None, 3).is_err(), "a let go of 3");
    assert_eq!(group.may_commit("b", Some(b.generation), 3), Ok(()));
    let stale = group.may_commit("b", Some(b.generation - 1), 3);
    assert!(matches!(stale, Err(MembershipError::StaleGeneration { .. })), "{stale:?}");
}

/// A member that stops heartbeating is dropped after its session, and what it held is free
/// at once; one that leaves frees it without waiting.
#[test]
fn dead_and_leaving_members_free_their_ranges() {
    let readable = ranges(&[1, 2]);
    let mut group = Membership::default();
    let a = beat(&mut group, "a", None, now(0, &readable));
    let b = beat(&mut group, "b", None, now(1, &readable));
    assert_eq!((a.ranges.len(), b.ranges.len()), (2, 0));
    let b = beat(&mut group, "b", Some(b.generation), now(SESSION_MS - 1, &readable));
    assert!(b.ranges.is_empty(), "a's session has not run out");
    let b = beat(&mut group, "b", Some(b.generation), now(SESSION_MS, &readable));
    assert_eq!(b.ranges, readable, "a was dropped");
    assert!(!group.members.contains_key("a"));
    let c = beat(&mut group, "c", None, now(SESSION_MS + 1, &readable));
    assert!(c.ranges.is_empty());
    group.leave("b", now(SESSION_MS + 2, &readable));
    let c = beat(&mut group, "c", Some(c.generation), now(SESSION_MS + 3, &readable));
    assert_eq!(c.ranges, readable, "b left");
}

#[test]
fn a_group_has_at_most_its_members() {
    let readable = ranges(&[1]);
    let mut group = Membership::default();
    for name in ["a", "b"] {
        group.heartbeat(name, None, now(0, &readable), 2).expect("room");
    }
    let refused = group.heartbeat("c", None, now(0, &readable), 2);
    assert_eq!(refused, Err(MembershipError::TooManyMembers { limit: 2 }));
    assert!(group.heartbeat("a", None, now(0, &readable), 2).is_ok(), "a member beats again");
}

/// Drained ranges leave and their children arrive, through the readable set.
#[test]
fn readable_changes_move_the_assignment() {
    let mut group = Membership::default();
    let before = ranges(&[1, 2]);
    let a = beat(&mut group, "a", None, now(0, &before));
    let after = ranges(&[2, 3, 4]);
    group.rebalance(now(5, &after));
    let a = beat(&mut group, "a", Some(a.generation), now(10, &after));
    assert_eq!(a.ranges, after);
}

#[derive(Clone, Debug)]
enum Step {
    /// A member heartbeats `after_ms` later, saying it applied its last answer (or not).
    Beat {
        member: u8,
        applied: bool,
        after_ms: u64,
    },
    Leave {
        member: u8,
    },
    /// The readable set becomes these ranges.
    Reshape {
        readable: Vec<u32>,
    },
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0_u8..4, any::<bool>(), 0_u64..20_000)
            .prop_map(|(member, applied, after_ms)| Step::Beat { member, applied, after_ms }),
        1 => (0_u8..4).prop_map(|member| Step::Leave { member }),
        1 => vec(0_u32..10, 0..8).prop_map(|readable| Step::Reshape { readable }),
    ]
}

proptest! {
    /// Whatever members do, `check` (run by every call) holds: no range is held by two
    /// members, and nobody is assigned a range another holds. And each member is told only
    /// readable ranges.
    #[test]
    fn no_range_is_ever_held_twice(steps in vec(arb_step(), 1..60)) {
        let mut group = Membership::default();
        let mut readable = ranges(&[0, 1, 2, 3, 4, 5]);
        let mut told: BTreeMap<u8, u64> = BTreeMap::new();
        let mut now_ms = 0;
        for step in steps {
            match step {
                Step::Beat { member, applied, after_ms } => {
                    now_ms += after_ms;
                    let name = format!("m{member}");
                    let applied = told.get(&member).map(|generation| {
                        if applied { *generation } else { generation.saturating_sub(1) }
                    });
                    let answer = beat(&mut group, &name, applied, now(now_ms, &readable));
                    prop_assert!(answer.ranges.is_subset(&readable));
                    told.insert(member, answer.generation);
                }
                Step::Leave { member } => {
                    group.leave(&format!("m{member}"), now(now_ms, &readable));
                    told.remove(&member);
                }
                Step::Reshape { readable: next } => {
                    readable = next.into_iter().collect();
                    group.rebalance(now(now_ms, &readable));
                }
            }
        }
    }

    /// Members that keep applying what they are told end up with every readable range, shared
    /// within one of each other.
    #[test]
    fn applying_members_converge(members in 1_u8..5, readable in vec(0_u32..12, 0..10)) {
        let readable: BTreeSet<u32> = readable.into_iter().collect();
        let mut group = Membership::default();
        let mut told: BTreeMap<u8, u64> = BTreeMap::new();
        for round in 0..4_u64 {
            for member in 0..members {
                let applied = told.get(&member).copied();
                let answer =
                    beat(&mut group, &format!("m{member}"), applied, now(round, &readable));
                told.insert(member, answer.generation);
            }
        }
        let counts: Vec<usize> =
            group.members.values().map(|member| member.assigned.len()).collect();
        let all: BTreeSet<u32> =
            group.members.values().flat_map(|member| member.assigned.iter().copied()).collect();
        prop_assert_eq!(all, readable);
        prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
    }
}
