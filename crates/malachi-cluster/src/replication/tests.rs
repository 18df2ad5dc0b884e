//! The primary's replication machine: tables for its steps, and a property test that drives it
//! with followers that append, sync, crash, fall out of reach, answer out of order and take
//! spans short.

use proptest::prelude::*;

use super::*;

fn config() -> ReplicationConfig {
    ReplicationConfig {
        window_batches: 2,
        window_bytes: 1_000,
        quorum_wait_ms: 100,
        catch_up_records_max: 4,
        held_bytes_max: 10_000,
        canary_short_answer_wedges: false,
    }
}

fn ships(actions: &[Action]) -> Vec<(u64, u64, u64)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Ship { follower, start, end, .. } => Some((*follower, *start, *end)),
            _ => None,
        })
        .collect()
}

#[test]
fn quorum_table() {
    let cases: Vec<(usize, usize)> = vec![(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)];
    for (replicas, expected) in cases {
        assert_eq!(quorum(replicas), expected, "{replicas}");
    }
    // The fewest replicas of a degraded placement: the smallest set whose quorum is a full
    // set's, checked against every smaller size.
    for (wanted, fewest) in [(1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (6, 6), (7, 6)] {
        assert_eq!(replicas_fewest(wanted), fewest, "{wanted}");
        assert!(quorum(fewest) >= quorum(wanted), "{wanted}");
        assert!((1..fewest).all(|smaller| quorum(smaller) < quorum(wanted)), "{wanted}");
    }
    let ends: Vec<(Vec<u64>, usize, u64)> = vec![
        (vec![10, 5, 7], 2, 7),
        (vec![10, 5, 7], 1, 10),
        (vec![10, 5, 7], 3, 5),
        (vec![3], 2, 0),
        (vec![4, 4, 9, 1, 2], 3, 4),
    ];
    for (ends, quorum, expected) in ends {
        assert_eq!(quorum_end(ends.clone(), quorum), expected, "{ends:?} q={quorum}");
    }
}

#[test]
fn a_batch_is_acknowledged_once_a_quorum_holds_it_durable() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    primary.staged(0, 10, 100, 0);
    assert_eq!(ships(&primary.take_actions()), [(2, 0, 10), (3, 0, 10)]);
    primary.local_durable(10);
    assert!(primary.take_actions().is_empty(), "one copy of three is no quorum");
    primary.follower_durable(3, 10);
    assert_eq!(primary.take_actions(), [Action::Acked { end: 10 }]);
    // The slow follower answers later; nothing more to acknowledge.
    primary.follower_durable(2, 10);
    assert!(primary.take_actions().is_empty());
    // Followers alone are a quorum too: the primary's own fsync may come last.
    primary.staged(10, 12, 20, 1);
    primary.take_actions();
    primary.follower_durable(2, 12);
    primary.follower_durable(3, 12);
    assert_eq!(primary.take_actions(), [Action::Acked { end: 12 }]);
}

#[test]
fn windows_bound_what_is_in_flight_and_answers_open_them() {
    let mut primary = Primary::new(&[2], 0, config());
    for batch in 0..4 {
        primary.staged(batch * 10, batch * 10 + 10, 100, 0);
    }
    assert_eq!(ships(&primary.take_actions()), [(2, 0, 10), (2, 10, 20)], "two spans at most");
    primary.follower_durable(2, 10);
    assert_eq!(ships(&primary.take_actions()), [(2, 20, 30)]);
    // An answer covering two spans (they were synced together) opens two places.
    primary.follower_durable(2, 30);
    assert_eq!(ships(&primary.take_actions()), [(2, 30, 40)]);
    // Bytes bound it too, but one span always goes, however large.
    let mut primary = Primary::new(&[2], 0, config());
    primary.staged(0, 1, 5_000, 0);
    primary.staged(1, 2, 10, 0);
    assert_eq!(ships(&primary.take_actions()), [(2, 0, 1)]);
}

#[test]
fn stale_answers_change_nothing_and_a_refusal_reships_from_the_followers_end() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    primary.staged(0, 10, 10, 0);
    primary.staged(10, 20, 10, 0);
    primary.local_durable(20);
    primary.take_actions();
    primary.follower_durable(2, 20);
    assert_eq!(primary.take_actions(), [Action::Acked { end: 20 }]);
    primary.follower_durable(2, 10);
    assert!(primary.take_actions().is_empty(), "a late answer for an earlier span");
    // Follower 3 lost what it had not synced: it refuses, and is shipped again from its end.
    primary.follower_refused(3, 0, 0);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 10), (3, 10, 20)]);
}

/// Every span of a refused window is refused in turn (the first one arrived late): only the
/// first refusal ships the window again; the others belong to the window already replaced.
/// Before window epochs, each of them reshipped a whole window, and spans in flight multiplied.
#[test]
fn the_rest_of_a_refused_window_ships_nothing_more() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    primary.staged(0, 10, 10, 0);
    primary.staged(10, 20, 10, 0);
    assert_eq!(ships(&primary.take_actions()), [(2, 0, 10), (3, 0, 10), (2, 10, 20), (3, 10, 20)]);
    // Follower 3 took neither (the first span came late): it refuses both, at its end 0.
    primary.follower_refused(3, 0, 0);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 10), (3, 10, 20)]);
    primary.follower_refused(3, 0, 0);
    assert!(ships(&primary.take_actions()).is_empty(), "a stale refusal ships nothing");
    // A failure of the old window is stale too: the follower is not taken out of reach.
    assert!(!primary.follower_unreachable(3, 0), "a stale failure changes nothing");
    primary.follower_durable(3, 20);
    primary.local_durable(20);
    assert_eq!(primary.acked_end(), 20);
    // A refusal of the current window is not stale.
    assert_eq!(primary.window_epoch(3), Some(1));
    primary.staged(20, 30, 10, 0);
    primary.take_actions();
    primary.follower_refused(3, 20, 1);
    assert_eq!(ships(&primary.take_actions()), [(3, 20, 30)]);
}

#[test]
fn a_follower_out_of_reach_is_shipped_from_the_file_once_back() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    assert!(primary.follower_unreachable(3, 0));
    for batch in 0..3 {
        primary.staged(batch * 5, batch * 5 + 5, 10, 0);
        primary.take_actions();
        primary.local_durable(batch * 5 + 5);
        primary.follower_durable(2, batch * 5 + 5);
    }
    assert_eq!(primary.acked_end(), 15, "a quorum of two out of three");
    primary.take_actions();
    // Every batch is durable on every follower in reach: none is held in memory any more.
    // From the file one span at a time, each bounded: the next goes once the last is answered.
    primary.retry_follower(3);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 4)], "from the file, alone");
    primary.follower_durable(3, 4);
    assert_eq!(ships(&primary.take_actions()), [(3, 4, 8)]);
    primary.follower_durable(3, 8);
    assert_eq!(ships(&primary.take_actions()), [(3, 8, 12)]);
}

/// A follower in reach that answers slowly pins nothing a quorum acknowledged past the budget:
/// those batches leave the primary's memory and are shipped to it from the file. What a quorum
/// has not acknowledged stays held, budget or not.
#[test]
fn a_slow_follower_does_not_pin_acknowledged_batches_past_the_budget() {
    let budgeted = ReplicationConfig { held_bytes_max: 25, window_batches: 16, ..config() };
    let mut primary = Primary::new(&[2, 3], 0, budgeted);
    for batch in 0..5 {
        primary.staged(batch * 10, batch * 10 + 10, 10, 0);
        primary.local_durable(batch * 10 + 10);
    }
    assert_eq!((primary.acked_end(), primary.held_from()), (0, 0), "nothing acknowledged");
    primary.take_actions();
    // Follower 2 holds everything; follower 3 is shipped it all and answers nothing.
    primary.follower_durable(2, 50);
    assert_eq!(primary.acked_end(), 50);
    assert_eq!(primary.held_from(), 30, "50 bytes held, 20 once under the budget of 25");
    // Follower 3 falls out of reach and comes back: it is shipped from the file below what is
    // held, one bounded span at a time.
    let epoch = primary.window_epoch(3).unwrap();
    assert!(primary.follower_unreachable(3, epoch));
    primary.retry_follower(3);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 4)], "from the file, alone");
    // Without the budget, the same follower pins every batch.
    let mut unbounded =
        Primary::new(&[2, 3], 0, ReplicationConfig { window_batches: 16, ..config() });
    for batch in 0..5 {
        unbounded.staged(batch * 10, batch * 10 + 10, 10, 0);
        unbounded.local_durable(batch * 10 + 10);
    }
    unbounded.follower_durable(2, 50);
    assert_eq!(unbounded.held_from(), 0);
}

/// A span from the file answered short (the driver's read stopped at its byte cap): the
/// follower is shipped on from its new end until it holds everything. Before, the short span
/// stayed in flight for good, nothing follows a span from the file, and the follower was never
/// shipped anything again (issue 25: 2,048 of a 4,096-record span, then nothing).
#[test]
fn a_span_answered_short_is_shipped_on_from_the_followers_end() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    assert!(primary.follower_unreachable(3, 0));
    for batch in 0..3 {
        primary.staged(batch * 5, batch * 5 + 5, 10, 0);
        primary.local_durable(batch * 5 + 5);
        primary.follower_durable(2, batch * 5 + 5);
    }
    primary.take_actions();
    primary.retry_follower(3);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 4)], "from the file");
    // (answer, the span shipped next: start, end)
    let cases: [(u64, Option<(u64, u64)>); 7] = [
        (1, Some((1, 5))),
        (3, Some((3, 7))),
        (7, Some((7, 11))),
        // A stale answer, below the span: nothing.
        (2, None),
        (11, Some((11, 15))),
        (14, Some((14, 15))),
        (15, None),
    ];
    for (answer, expected) in cases {
        primary.follower_durable(3, answer);
        let expected: Vec<_> = expected.map(|(start, end)| (3, start, end)).into_iter().collect();
        assert_eq!(ships(&primary.take_actions()), expected, "answer {answer}");
    }
    assert_eq!(primary.follower_lag().collect::<Vec<_>>(), [(2, 0), (3, 0)]);
}

/// The canary the simulator must catch keeps the old behaviour: after a short answer the
/// follower is shipped nothing more and stays behind.
#[test]
fn the_short_answer_canary_wedges_the_follower() {
    let canary = ReplicationConfig { canary_short_answer_wedges: true, ..config() };
    let mut primary = Primary::new(&[2, 3], 0, canary);
    assert!(primary.follower_unreachable(3, 0));
    primary.staged(0, 10, 20, 0);
    primary.local_durable(10);
    primary.follower_durable(2, 10);
    primary.take_actions();
    primary.retry_follower(3);
    assert_eq!(ships(&primary.take_actions()), [(3, 0, 4)]);
    primary.follower_durable(3, 2);
    assert_eq!(ships(&primary.take_actions()), []);
    assert_eq!(primary.follower_lag().collect::<Vec<_>>(), [(2, 0), (3, 8)]);
}

/// Pipelined spans from memory, the first answered short: the span behind it is refused (it
/// starts past the follower's end), which ships the follower again from there.
#[test]
fn a_short_answer_with_spans_behind_it_reships_after_their_refusal() {
    let mut primary = Primary::new(&[2], 0, config());
    primary.staged(0, 10, 10, 0);
    primary.staged(10, 20, 10, 0);
    assert_eq!(ships(&primary.take_actions()), [(2, 0, 10), (2, 10, 20)]);
    primary.follower_durable(2, 6);
    assert!(ships(&primary.take_actions()).is_empty(), "the span behind is still out");
    primary.follower_refused(2, 6, 0);
    assert_eq!(ships(&primary.take_actions()), [(2, 6, 10), (2, 10, 20)]);
}

#[test]
fn without_a_quorum_a_batch_fails_in_bounded_time_and_so_does_every_later_one() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    assert!(primary.follower_unreachable(2, 0));
    assert!(primary.follower_unreachable(3, 0));
    primary.staged(0, 10, 10, 1_000);
    primary.local_durable(10);
    primary.tick(1_099);
    assert!(primary.take_actions().is_empty(), "still waiting");
    primary.tick(1_100);
    assert_eq!(primary.take_actions(), [Action::NoQuorum { from: 0 }]);
    assert!(!primary.writable());
    primary.staged(10, 11, 1, 1_200);
    assert_eq!(primary.take_actions(), [Action::NoQuorum { from: 0 }]);
    // A follower answering late acknowledges nothing past the refusal.
    primary.follower_durable(2, 10);
    assert_eq!(primary.acked_end(), 0);
}

/// What happens to the machine and its followers, drawn by proptest.
#[derive(Clone, Debug)]
enum Step {
    Stage {
        records: u64,
    },
    LocalSync,
    /// The follower takes the oldest span shipped to it, and syncs it (or not yet). `short`:
    /// the span carried only its first half, as a span read from the file and cut at the
    /// driver's byte cap does.
    Deliver {
        follower: usize,
        sync: bool,
        short: bool,
    },
    /// The follower syncs what it appended and answers.
    Sync {
        follower: usize,
    },
    /// The oldest answer to the primary arrives now, or after the next one.
    Reorder {
        follower: usize,
    },
    /// The follower's process dies: unsynced records and what was in flight are lost.
    Crash {
        follower: usize,
    },
    Retry {
        follower: usize,
    },
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..5u64).prop_map(|records| Step::Stage { records }),
        Just(Step::LocalSync),
        (0..2usize, any::<bool>(), any::<bool>())
            .prop_map(|(follower, sync, short)| Step::Deliver { follower, sync, short }),
        (0..2usize).prop_map(|follower| Step::Sync { follower }),
        (0..2usize).prop_map(|follower| Step::Reorder { follower }),
        (0..2usize).prop_map(|follower| Step::Crash { follower }),
        (0..2usize).prop_map(|follower| Step::Retry { follower }),
        Just(Step::Tick),
    ]
}

/// A follower's copy: what it appended and what of that it synced.
#[derive(Clone, Debug, Default)]
struct Copy {
    appended: u64,
    synced: u64,
    /// Spans shipped to it, in order, each with its window epoch.
    inbox: std::collections::VecDeque<(u64, u64, u64)>,
}

/// A follower takes a span: appended when it starts at its end (and synced and answered when
/// `sync`); otherwise refused with its end, after syncing what it holds, as a real follower
/// answers a span it cannot take.
fn deliver(
    primary: &mut Primary,
    follower: u64,
    copy: &mut Copy,
    (start, end, epoch): (u64, u64, u64),
    (sync, short): (bool, bool),
) {
    if start == copy.appended {
        copy.appended = if short { start + (end - start).div_ceil(2) } else { end };
        if sync {
            copy.synced = copy.appended;
            primary.follower_durable(follower, copy.synced);
        }
    } else {
        copy.synced = copy.appended;
        primary.follower_refused(follower, copy.synced, epoch);
    }
}

proptest! {
    /// Whatever the followers do, an acknowledged record is durable on a quorum when it is
    /// acknowledged, the acknowledged end only grows, and with every follower answering in the
    /// end everything staged is acknowledged (unless a quorum was refused in time).
    #[test]
    fn acknowledged_records_are_durable_on_a_quorum(steps in proptest::collection::vec(step(), 1..200)) {
        let followers = [2u64, 3];
        // A small memory budget, so batches are dropped while a follower still lacks them.
        let mut primary = Primary::new(&followers, 0, ReplicationConfig {
            quorum_wait_ms: 50,
            held_bytes_max: 30,
            ..config()
        });
        let mut copies = [Copy::default(), Copy::default()];
        let (mut staged, mut local_synced, mut now_ms, mut acked) = (0u64, 0u64, 0u64, 0u64);
        let mut refused = false;
        for step in steps {
            match step {
                Step::Stage { records } => {
                    primary.staged(staged, staged + records, records * 10, now_ms);
                    staged += records;
                }
                Step::LocalSync => {
                    local_synced = staged;
                    primary.local_durable(staged);
                }
                Step::Deliver { follower, sync, short } => {
                    if let Some(span) = copies[follower].inbox.pop_front() {
                        let copy = &mut copies[follower];
                        deliver(&mut primary, followers[follower], copy, span, (sync, short));
                    }
                }
                Step::Sync { follower } => {
                    let copy = &mut copies[follower];
                    copy.synced = copy.appended;
                    primary.follower_durable(followers[follower], copy.synced);
                }
                Step::Reorder { follower } => {
                    // A stale answer: an end this follower reported durable before.
                    let copy = &copies[follower];
                    primary.follower_durable(followers[follower], copy.synced / 2);
                }
                Step::Crash { follower } => {
                    let copy = &mut copies[follower];
                    copy.appended = copy.synced;
                    copy.inbox.clear();
                    let epoch = primary.window_epoch(followers[follower]).unwrap();
                    let _ = primary.follower_unreachable(followers[follower], epoch);
                }
                Step::Retry { follower } => primary.retry_follower(followers[follower]),
                Step::Tick => {
                    now_ms += 10;
                    primary.tick(now_ms);
                }
            }
            for action in primary.take_actions() {
                match action {
                    Action::Ship { follower, start, end, epoch } => {
                        let at = followers.iter().position(|&node| node == follower).unwrap();
                        prop_assert!(start < end && end <= staged);
                        copies[at].inbox.push_back((start, end, epoch));
                        // Spans in flight stay within a window or two (the current one, and
                        // what is left of the one it replaced), never a multiple of them.
                        let window = config().window_batches;
                        prop_assert!(copies[at].inbox.len() <= 2 * window, "{:?}", copies[at].inbox);
                    }
                    Action::Acked { end } => {
                        prop_assert!(end > acked, "acknowledged end went from {acked} to {end}");
                        let holding = copies.iter().filter(|copy| copy.synced >= end).count()
                            + usize::from(local_synced >= end);
                        prop_assert!(holding >= 2, "{end} acknowledged on {holding} copies");
                        acked = end;
                    }
                    Action::NoQuorum { from } => {
                        prop_assert!(from >= acked.min(from));
                        refused = true;
                    }
                }
            }
            prop_assert_eq!(primary.acked_end(), acked);
        }
        // Every follower back, every span delivered and synced, the primary synced. A
        // follower that appended a span without syncing it yet syncs and answers first, as a
        // live one always does.
        primary.local_durable(staged);
        for (copy, &follower) in copies.iter_mut().zip(&followers) {
            copy.synced = copy.appended;
            primary.follower_durable(follower, copy.synced);
        }
        for _ in 0..10_000 {
            for (at, &follower) in followers.iter().enumerate() {
                primary.retry_follower(follower);
                for action in primary.take_actions() {
                    if let Action::Ship { follower, start, end, epoch } = action {
                        let at = followers.iter().position(|&node| node == follower).unwrap();
                        copies[at].inbox.push_back((start, end, epoch));
                    }
                }
                if let Some(span) = copies[at].inbox.pop_front() {
                    deliver(&mut primary, follower, &mut copies[at], span, (true, false));
                }
            }
        }
        primary.take_actions();
        if !refused && primary.writable() {
            prop_assert_eq!(primary.acked_end(), staged);
            // And every follower in reach holds every record, not only a quorum of them.
            for copy in &copies {
                prop_assert_eq!(copy.synced, staged, "a follower was left behind");
            }
        }
    }
}

/// Every span of a window to a follower fails when it cannot be reached, at once when
/// membership holds it dead; only the first failure puts it out of reach and retries it, so
/// one window goes out per retry however many spans it had (each retrying shipped a window of
/// its own, whose spans retried in turn: the chaos drill's runaway).
#[test]
fn only_the_first_failure_of_a_window_retries_it() {
    let mut primary = Primary::new(&[2, 3], 0, config());
    for batch in 0..4 {
        primary.staged(batch * 5, batch * 5 + 5, 10, 0);
    }
    let to_3 = |actions: &[Action]| ships(actions).iter().filter(|s| s.0 == 3).count();
    let window = to_3(&primary.take_actions());
    assert!(window >= 2, "a window of several spans");
    let retries: Vec<bool> = (0..window).map(|_| primary.follower_unreachable(3, 0)).collect();
    assert_eq!(retries.iter().filter(|&&first| first).count(), 1, "{retries:?}");
    assert!(retries[0], "the first failure puts it out of reach");
    primary.retry_follower(3);
    assert_eq!(to_3(&primary.take_actions()), window, "one window again, from its durable end");
    let retries: Vec<bool> = (0..window).map(|_| primary.follower_unreachable(3, 1)).collect();
    assert_eq!(retries.iter().filter(|&&first| first).count(), 1, "once per window: {retries:?}");
}
