use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn broker(broker_id: u64, zone: &str) -> Candidate {
    let attributes = BTreeMap::from([("zone".to_string(), zone.to_string())]);
    Candidate { broker_id, attributes }
}

fn spread(min_domains: u32, max_skew: Option<u32>, mode: PlacementMode) -> Constraints {
    Constraints { spread_by: Some("zone".into()), min_domains, max_skew, mode }
}

/// A cluster of up to 7 brokers over up to 4 zones.
fn cluster() -> impl Strategy<Value = Vec<Candidate>> {
    cluster_of(1)
}

/// A cluster of `brokers_min` to 7 brokers over up to 4 zones.
fn cluster_of(brokers_min: usize) -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec(0u8..4, brokers_min..=7).prop_map(|zones| {
        zones
            .iter()
            .enumerate()
            .map(|(at, zone)| broker(at as u64 + 1, &format!("z{zone}")))
            .collect()
    })
}

/// What the constraints say of one choice, computed from scratch.
fn satisfies(chosen: &[&Candidate], live: &[Candidate], constraints: &Constraints) -> bool {
    let zone = |candidate: &Candidate| candidate.attributes["zone"].clone();
    let mut counts: BTreeMap<String, u32> = live.iter().map(|c| (zone(c), 0)).collect();
    for candidate in chosen {
        *counts.get_mut(&zone(candidate)).unwrap() += 1;
    }
    let domains = counts.values().filter(|&&count| count > 0).count() as u32;
    let skew = counts.values().max().unwrap() - counts.values().min().unwrap();
    domains >= constraints.min_domains && constraints.max_skew.is_none_or(|max| skew <= max)
}

/// Every choice of `size` brokers among `live`.
fn subsets(live: &[Candidate], size: usize) -> Vec<Vec<&Candidate>> {
    (0u32..1 << live.len())
        .filter(|mask| mask.count_ones() as usize == size)
        .map(|mask| {
            live.iter()
                .enumerate()
                .filter(|(at, _)| mask & (1 << at) != 0)
                .map(|(_, c)| c)
                .collect()
        })
        .collect()
}

proptest! {
    /// The answer depends on the object and the set of live brokers, not on their order.
    #[test]
    fn placement_is_deterministic_and_distinct(
        live in cluster(), object in any::<u64>(), replicas in 1usize..=3, rotate in 0usize..7,
    ) {
        let replicas = replicas.min(live.len());
        let object = object.to_le_bytes();
        let constraints = spread(2, Some(1), PlacementMode::Soft);
        let first = place(&object, replicas, &live, &[], &constraints).unwrap();
        let mut rotated = live.clone();
        rotated.rotate_left(rotate % live.len());
        rotated.reverse();
        prop_assert_eq!(&place(&object, replicas, &rotated, &[], &constraints).unwrap(), &first);
        let distinct: BTreeSet<u64> = first.brokers.iter().copied().collect();
        prop_assert_eq!(distinct.len(), replicas);
    }

    /// Greedy filling is as good as any choice: the constraints are met whenever some choice of
    /// brokers meets them, and hard constraints refuse exactly when none does.
    #[test]
    fn constraints_are_met_whenever_they_can_be(
        live in cluster(),
        object in any::<u64>(),
        replicas in 1usize..=4,
        min_domains in 0u32..=4,
        max_skew in prop::option::of(0u32..=2),
    ) {
        let replicas = replicas.min(live.len());
        let object = object.to_le_bytes();
        let soft = spread(min_domains, max_skew, PlacementMode::Soft);
        let possible = subsets(&live, replicas).iter().any(|chosen| satisfies(chosen, &live, &soft));
        let placed = place(&object, replicas, &live, &[], &soft).unwrap();
        let chosen: Vec<&Candidate> = placed
            .brokers
            .iter()
            .map(|id| live.iter().find(|c| c.broker_id == *id).unwrap())
            .collect();
        prop_assert_eq!(placed.constraints_met, satisfies(&chosen, &live, &soft));
        prop_assert_eq!(placed.constraints_met, possible);
        let hard = Constraints { mode: PlacementMode::Hard, ..soft };
        let refused = matches!(
            place(&object, replicas, &live, &[], &hard),
            Err(PlacementError::ConstraintsUnmet { .. })
        );
        prop_assert_eq!(refused, !possible);
    }

    /// When one broker leaves, and the previous replicas are kept where they can be, only a
    /// replica on the broker that left moves, and only to one new broker; with or without
    /// spreading over zones.
    #[test]
    fn one_broker_leaving_moves_at_most_its_own_replica(
        live in cluster_of(2), object in any::<u64>(), replicas in 1usize..=3, leaving in 0usize..7,
    ) {
        // Someone must be left to take a replica.
        let replicas = replicas.min(live.len() - 1);
        let object = object.to_le_bytes();
        for constraints in [Constraints::default(), spread(0, None, PlacementMode::Soft)] {
            let before = place(&object, replicas, &live, &[], &constraints).unwrap().brokers;
            let gone = live[leaving % live.len()].broker_id;
            let remaining: Vec<Candidate> =
                live.iter().filter(|c| c.broker_id != gone).cloned().collect();
            let after =
                place(&object, replicas, &remaining, &before, &constraints).unwrap().brokers;
            let kept: BTreeSet<u64> = before.iter().copied().filter(|id| *id != gone).collect();
            let now: BTreeSet<u64> = after.iter().copied().collect();
            prop_assert!(kept.is_subset(&now), "{before:?} -> {after:?} after {gone} left");
            // The hash alone keeps them too (the others' ranks do not change): survivors only
            // matter where brokers joined or constraints changed since.
            let fresh = place(&object, replicas, &remaining, &[], &constraints).unwrap().brokers;
            prop_assert_eq!(fresh.iter().copied().collect::<BTreeSet<u64>>(), now);
        }
    }

    /// A broker joining takes over replicas only where it ranks among the first, and survivors
    /// keep theirs: with them, nothing moves at all.
    #[test]
    fn survivors_stay_when_a_broker_joins(
        live in cluster_of(2), object in any::<u64>(), replicas in 1usize..=3,
    ) {
        let replicas = replicas.min(live.len() - 1);
        let object = object.to_le_bytes();
        let constraints = Constraints::default();
        let (joining, before_join) = live.split_last().unwrap();
        let before = place(&object, replicas, before_join, &[], &constraints).unwrap().brokers;
        let after = place(&object, replicas, &live, &before, &constraints).unwrap().brokers;
        prop_assert_eq!(
            after.iter().copied().collect::<BTreeSet<u64>>(),
            before.iter().copied().collect::<BTreeSet<u64>>(),
            "broker {} joined", joining.broker_id
        );
    }
}

#[test]
fn hard_constraints_refuse_and_soft_ones_report() {
    let live = [broker(1, "a"), broker(2, "a"), broker(3, "b")];
    let hard = spread(3, None, PlacementMode::Hard);
    assert_eq!(
        place(b"segment-7", 3, &live, &[], &hard),
        Err(PlacementError::ConstraintsUnmet {
            domains: 2,
            skew: 1,
            min_domains: 3,
            max_skew: None
        })
    );
    let soft = spread(3, None, PlacementMode::Soft);
    let placed = place(b"segment-7", 3, &live, &[], &soft).unwrap();
    assert!(!placed.constraints_met);
    assert_eq!(placed.brokers.len(), 3);
    assert_eq!(
        place(b"segment-7", 4, &live, &[], &soft),
        Err(PlacementError::NotEnoughBrokers { replicas: 4, live: 3 })
    );
}

/// Replicas spread over zones before any zone gets a second one.
#[test]
fn replicas_fill_zones_evenly() {
    let live: Vec<Candidate> =
        (1..=9).map(|id| broker(id, ["a", "b", "c"][(id % 3) as usize])).collect();
    for object in 0u64..200 {
        let placed =
            place(&object.to_le_bytes(), 3, &live, &[], &spread(0, None, PlacementMode::Soft))
                .unwrap();
        let zones: BTreeSet<u64> = placed.brokers.iter().map(|id| id % 3).collect();
        assert_eq!(zones.len(), 3, "object {object}: {:?}", placed.brokers);
    }
}

/// Each broker is the primary of about its share of the objects.
#[test]
fn primaries_spread_over_brokers() {
    let live: Vec<Candidate> = (1..=5).map(|id| broker(id, "a")).collect();
    let mut primaries = BTreeMap::<u64, u32>::new();
    for object in 0u64..5_000 {
        let placed = place(&object.to_le_bytes(), 3, &live, &[], &Constraints::default()).unwrap();
        *primaries.entry(placed.brokers[0]).or_default() += 1;
    }
    for (broker_id, count) in primaries {
        assert!((850..=1_150).contains(&count), "broker {broker_id} leads {count} of 5,000");
    }
}

/// Attributes as text, and what they parse to (pairs, or the error).
type AttributeCase = (&'static str, Result<&'static [(&'static str, &'static str)], &'static str>);

#[test]
fn attributes_parse_as_operators_write_them() {
    let cases: &[AttributeCase] = &[
        ("", Ok(&[])),
        ("rack=a,zone=eu-1", Ok(&[("rack", "a"), ("zone", "eu-1")])),
        (" rack = a , zone=eu-1, ", Ok(&[("rack", "a"), ("zone", "eu-1")])),
        ("zone=", Ok(&[("zone", "")])),
        ("rack", Err("attribute \"rack\" is not name=value")),
        ("=a", Err("attribute \"=a\" has no name")),
        ("zone=a,zone=b", Err("attribute \"zone\" is given twice")),
    ];
    for (text, expected) in cases {
        let expected = expected.map(|pairs| {
            pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()
        });
        assert_eq!(parse_attributes(text), expected.map_err(str::to_string), "{text:?}");
    }
}
