//! Tables for the seat planner and the leadership spread: the decisions, not the Raft calls.

use super::*;

const ALIVE: BrokerFacts = BrokerFacts { eligible: true, alive: true, gone: false };
/// Down for less than the replace time: keeps its seat.
const DOWN: BrokerFacts = BrokerFacts { eligible: true, alive: false, gone: false };
/// Down for longer than the replace time.
const GONE: BrokerFacts = BrokerFacts { eligible: true, alive: false, gone: true };
/// Decommissioned (still up).
const LEAVING: BrokerFacts = BrokerFacts { eligible: false, alive: true, gone: true };

fn view(voters: &[u64], learners: &[u64], brokers: &[(u64, BrokerFacts)]) -> SeatView {
    SeatView {
        object: group_object(7),
        wanted: 3,
        voters: voters.iter().copied().collect(),
        learners: learners.iter().copied().collect(),
        brokers: brokers.iter().copied().collect(),
    }
}

/// Applies a change as the group's leader would.
fn apply(view: &mut SeatView, change: SeatChange) {
    match change {
        SeatChange::Move { into, out, keep_learner } => {
            assert!(view.learners.remove(&into), "{into} was a learner");
            view.voters.insert(into);
            if let Some(out) = out {
                view.voters.remove(&out);
                if keep_learner {
                    view.learners.insert(out);
                }
            }
        }
        SeatChange::Remove { out, keep_learner } => {
            view.voters.remove(&out);
            view.learners.remove(&out);
            if keep_learner {
                view.learners.insert(out);
            }
        }
        SeatChange::AddLearner { node_id } => {
            assert!(view.learners.insert(node_id), "{node_id} was no learner");
        }
    }
}

#[test]
fn plan_table() {
    let alive = |ids: &[u64]| ids.iter().map(|&id| (id, ALIVE)).collect::<Vec<_>>();
    let with = |mut brokers: Vec<(u64, BrokerFacts)>, id: u64, facts| {
        brokers.retain(|(node_id, _)| *node_id != id);
        brokers.push((id, facts));
        brokers
    };
    let cases: Vec<(&str, SeatView, Option<SeatChange>)> = vec![
        ("all seated", view(&[1, 2, 3], &[], &alive(&[1, 2, 3])), None),
        (
            "a free seat goes to a live learner",
            view(&[1, 2], &[3], &alive(&[1, 2, 3])),
            Some(SeatChange::Move { into: 3, out: None, keep_learner: true }),
        ),
        (
            "a gone voter's seat moves to the live learner, the voter kept as a learner",
            view(&[1, 2, 3], &[4], &with(alive(&[1, 2, 4]), 3, GONE)),
            Some(SeatChange::Move { into: 4, out: Some(3), keep_learner: true }),
        ),
        (
            "a voter down for less than the replace time keeps its seat",
            view(&[1, 2, 3], &[], &with(alive(&[1, 2]), 3, DOWN)),
            None,
        ),
        (
            "a gone voter with nobody to take its seat keeps it",
            view(&[1, 2, 3], &[], &with(alive(&[1, 2]), 3, GONE)),
            None,
        ),
        (
            "a leaving voter gives its seat up even with nobody to take it",
            view(&[1, 2, 3], &[], &with(alive(&[1, 2]), 3, LEAVING)),
            Some(SeatChange::Remove { out: 3, keep_learner: false }),
        ),
        (
            "a leaving voter's seat moves, and the broker is dropped",
            view(&[1, 2, 3], &[4], &with(alive(&[1, 2, 4]), 3, LEAVING)),
            Some(SeatChange::Move { into: 4, out: Some(3), keep_learner: false }),
        ),
        (
            "a leaving learner is dropped",
            view(&[1, 2, 3], &[4], &with(alive(&[1, 2, 3]), 4, LEAVING)),
            Some(SeatChange::Remove { out: 4, keep_learner: false }),
        ),
        (
            "a member the registry forgot is dropped",
            view(&[1, 2, 3], &[9], &alive(&[1, 2, 3])),
            Some(SeatChange::Remove { out: 9, keep_learner: false }),
        ),
        (
            "a surplus voter off the target is demoted",
            SeatView { wanted: 2, ..view(&[1, 2, 3], &[], &alive(&[1, 2, 3])) },
            None, // filled in below: which voter is off the target is placement's answer
        ),
        (
            "a live registered broker the group lacks becomes a learner",
            view(&[1, 2, 3], &[], &alive(&[1, 2, 3, 4])),
            Some(SeatChange::AddLearner { node_id: 4 }),
        ),
        (
            "a dead registered broker the group lacks is left out until it is alive",
            view(&[1, 2, 3], &[], &with(alive(&[1, 2, 3]), 4, DOWN)),
            None,
        ),
        (
            "a dead learner never takes a seat",
            view(&[1, 2], &[3], &with(alive(&[1, 2]), 3, DOWN)),
            None,
        ),
    ];
    for (name, view, expected) in cases {
        let expected = expected.or_else(|| {
            let target = view.target();
            let surplus = view.voters.iter().copied().find(|id| !target.contains(id));
            surplus
                .filter(|_| view.voters.len() > view.wanted)
                .map(|out| SeatChange::Remove { out, keep_learner: true })
        });
        assert_eq!(view.plan(), expected, "{name}");
    }
}

/// Brokers that join share the seats: from any start, the changes converge on the target in
/// at most one move per seat, the group never has fewer voters than it wants on the way, and
/// once there, nothing more is planned.
#[test]
fn seats_spread_over_joined_brokers_and_settle() {
    for group_id in 1..=64 {
        let brokers: Vec<(u64, BrokerFacts)> = (1..=5).map(|id| (id, ALIVE)).collect();
        let mut view =
            SeatView { object: group_object(group_id), ..view(&[1, 2, 3], &[4, 5], &brokers) };
        let target: BTreeSet<u64> = view.target().into_iter().collect();
        assert_eq!(target.len(), 3);
        let mut moves = 0;
        while let Some(change) = view.plan() {
            apply(&mut view, change);
            moves += 1;
            assert!(view.voters.len() >= 3, "group {group_id}: {:?}", view.voters);
            assert!(moves <= 3, "group {group_id} does not settle");
        }
        assert_eq!(view.voters, target, "group {group_id}");
        assert_eq!(view.learners.len(), 2);
    }
}

/// A voter down for a moment plans exactly what it would alive, except that it is never the
/// broker a seat moves to: a restart moves nothing.
#[test]
fn a_voter_down_briefly_changes_no_plan() {
    for group_id in 1..=64 {
        let object = group_object(group_id);
        let alive: Vec<(u64, BrokerFacts)> = (1..=5).map(|id| (id, ALIVE)).collect();
        let mut down = alive.clone();
        down[2].1 = DOWN;
        let up = SeatView { object: object.clone(), ..view(&[1, 2, 3], &[4, 5], &alive) };
        let briefly = SeatView { object, ..view(&[1, 2, 3], &[4, 5], &down) };
        assert_eq!(up.target(), briefly.target(), "group {group_id}");
        assert_eq!(up.plan(), briefly.plan(), "group {group_id}");
    }
}

#[test]
fn leadership_spreads_evenly_over_live_voters() {
    let led = |preferred: &BTreeMap<u64, u64>| {
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for node_id in preferred.values() {
            *counts.entry(*node_id).or_default() += 1;
        }
        counts
    };
    // (vnodes, voters of each, live brokers, how many each live broker leads, sorted)
    type Case = (u64, Vec<u64>, Vec<u64>, Vec<usize>);
    let cases: Vec<Case> = vec![
        (8, vec![1, 2, 3], vec![1, 2, 3], vec![2, 3, 3]),
        (8, vec![1, 2, 3], vec![1, 3], vec![4, 4]),
        (3, vec![1, 2, 3], vec![1, 2, 3], vec![1, 1, 1]),
        (1, vec![1, 2, 3], vec![1, 2, 3], vec![1]),
        (8, vec![1, 2, 3], vec![], vec![]),
    ];
    for (vnodes, voters, live, expected) in cases {
        let groups: Vec<(u64, BTreeSet<u64>)> =
            (1..=vnodes).map(|group_id| (group_id, voters.iter().copied().collect())).collect();
        let preferred = preferred_leaders(&groups, |node_id| live.contains(&node_id));
        let mut counts: Vec<usize> = led(&preferred).into_values().collect();
        counts.sort();
        assert_eq!(counts, expected, "{vnodes} vnodes, live {live:?}");
        assert!(preferred.values().all(|node_id| live.contains(node_id)));
        assert_eq!(preferred, preferred_leaders(&groups, |node_id| live.contains(&node_id)));
    }
    // Vnodes with different voters: each is led by one of its own.
    let groups: Vec<(u64, BTreeSet<u64>)> =
        vec![(1, [1, 2, 3].into()), (2, [3, 4, 5].into()), (3, [1, 4, 5].into())];
    let preferred = preferred_leaders(&groups, |_| true);
    for (group_id, voters) in &groups {
        assert!(voters.contains(&preferred[group_id]), "group {group_id}");
    }
    assert_eq!(led(&preferred).values().max(), Some(&1));
}
