use proptest::prelude::*;

use super::*;

#[test]
fn roles_follow_the_replica_order() {
    let cases: &[(&str, &[u64], u64, Role)] = &[
        ("alone", &[4], 4, Role::Alone),
        ("primary", &[4, 5, 6], 4, Role::Primary { followers: vec![5, 6] }),
        ("follower", &[4, 5, 6], 6, Role::Follower { primary: 4 }),
        ("outside", &[4, 5], 6, Role::Outside { replicas: vec![4, 5] }),
    ];
    for (name, replicas, own, expected) in cases {
        assert_eq!(Role::of(replicas, *own), *expected, "{name}");
    }
}

#[test]
fn only_a_follower_takes_batches_and_only_from_its_primary() {
    let follower = Role::Follower { primary: 1 };
    let cases: &[(&str, Role, u64, Result<(), Refusal>)] = &[
        ("its primary", follower.clone(), 1, Ok(())),
        ("another broker", follower, 2, Err(Refusal::NotFromPrimary)),
        ("to the primary", Role::Primary { followers: vec![2] }, 2, Err(Refusal::PrimaryHere)),
        ("to a lone copy", Role::Alone, 2, Err(Refusal::PrimaryHere)),
        ("to no copy", Role::Outside { replicas: vec![1, 2] }, 1, Err(Refusal::NotFromPrimary)),
    ];
    for (name, role, source, expected) in cases {
        assert_eq!(admit(role, *source), *expected, "{name}");
    }
}

#[test]
fn a_batch_goes_where_the_copy_ends() {
    // (case, staged end, batch start, records, placement)
    let cases: &[(&str, u64, u64, usize, Placement)] = &[
        ("continues the copy", 10, 10, 3, Placement::Stage { skip: 0 }),
        ("overlaps the copy's end", 10, 8, 5, Placement::Stage { skip: 2 }),
        ("held already", 10, 4, 6, Placement::Held),
        ("held, ending before", 10, 2, 3, Placement::Held),
        ("a gap", 10, 11, 3, Placement::Gap),
        ("into an empty copy", 0, 0, 1, Placement::Stage { skip: 0 }),
    ];
    for (name, staged_end, start, records, expected) in cases {
        assert_eq!(place(*staged_end, *start, *records), *expected, "{name}");
    }
}

proptest! {
    /// Whatever order batches of a head arrive in, and however often, staging what `place`
    /// says builds exactly the head's records, in order.
    #[test]
    fn staging_in_any_order_builds_the_head(
        lengths in proptest::collection::vec(1usize..5, 1..8),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 1..40),
    ) {
        let mut spans = Vec::new();
        let mut start = 0u64;
        for length in &lengths {
            spans.push((start, *length));
            start += *length as u64;
        }
        let head_end = start;
        let mut copy: Vec<u64> = Vec::new();
        // Deliveries in the drawn order, then every span once more in order (the primary
        // ships again from the copy's end after a refusal).
        let drawn = order.iter().map(|index| spans[index.index(spans.len())]);
        for (start, length) in drawn.chain(spans.iter().copied()) {
            let records: Vec<u64> = (start..start + length as u64).collect();
            match place(copy.len() as u64, start, length) {
                Placement::Gap => prop_assert!(start > copy.len() as u64),
                Placement::Held => prop_assert!(start + length as u64 <= copy.len() as u64),
                Placement::Stage { skip } => copy.extend_from_slice(&records[skip..]),
            }
        }
        prop_assert_eq!(copy, (0..head_end).collect::<Vec<u64>>());
    }
}

#[test]
fn what_readers_see_never_moves_back() {
    let mut copy = Copy::default();
    copy.acked(5, 8);
    assert_eq!(copy.visible_end(), 5, "up to the acknowledged end");
    copy.acked(9, 7);
    assert_eq!(copy.visible_end(), 7, "no further than the copy is durable");
    copy.acked(3, 3);
    assert_eq!(copy.visible_end(), 7, "an older answer takes nothing back");
}
