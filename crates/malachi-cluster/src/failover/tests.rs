use super::*;

fn copy(node_id: u64, end_offset: u64, sealed: bool) -> CopyEnd {
    CopyEnd { node_id, end_offset, data_bytes: end_offset * 10, sealed }
}

fn copies(ends: &[(u64, bool)]) -> Vec<CopyEnd> {
    ends.iter().enumerate().map(|(at, &(end, sealed))| copy(at as u64 + 1, end, sealed)).collect()
}

#[test]
fn the_seal_point_is_the_highest_end_unless_copies_are_sealed() {
    // (case, each fenced copy's end and whether it is sealed, the seal point)
    type Case = (&'static str, &'static [(u64, bool)], u64);
    let cases: &[Case] = &[
        ("one copy", &[(5, false)], 5),
        ("highest fenced end", &[(5, false), (9, false), (7, false)], 9),
        ("a sealed copy decides", &[(140, false), (132, true), (132, true)], 132),
        ("sealed below a longer unsealed one", &[(132, true), (150, false)], 132),
        ("most sealed copies", &[(10, true), (12, true), (10, true)], 10),
        ("the higher on a tie", &[(10, true), (12, true), (11, false)], 12),
    ];
    for (name, ends, expected) in cases {
        assert_eq!(seal_point(&copies(ends)), *expected, "{name}");
    }
}

/// One failover of a segment on replicas 1, 2, 3 run by broker 2, driven through its steps.
struct Run {
    /// The replicas that answer the probe.
    answered: &'static [u64],
    /// Each fenced copy: node, end, sealed.
    fenced: &'static [(u64, u64, bool)],
    /// Where each filled copy ends after its fill.
    filled: &'static [(u64, u64)],
    /// The copies whose seal succeeds.
    seal_succeeds: &'static [u64],
}

/// What the run produced: the fill, the seal, the outcome; or where it stopped.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Refused(&'static str),
    Done { fill: Fill, seal_at: SealAt, sealed: Sealed },
}

fn drive(run: &Run, canaries: FailoverCanaries) -> Outcome {
    let mut failover = Failover::new(vec![1, 2, 3], 2, canaries);
    assert_eq!(failover.replicas(), [1, 2, 3]);
    let to_fence = match failover.probed(run.answered.to_vec()) {
        Ok(nodes) => nodes,
        Err(refusal) => return Outcome::Refused(refusal.what),
    };
    let fenced: Vec<CopyEnd> = run
        .fenced
        .iter()
        .filter(|(node, _, _)| to_fence.contains(node))
        .map(|&(node_id, end_offset, sealed)| CopyEnd {
            node_id,
            end_offset,
            data_bytes: end_offset * 10,
            sealed,
        })
        .collect();
    let fill = match failover.fenced(fenced.clone()) {
        Ok(fill) => fill,
        Err(refusal) => return Outcome::Refused(refusal.what),
    };
    let filled = run.filled.iter().copied().filter(|(node, _)| fill.copies.contains(node));
    let seal_at = failover.filled(filled.collect());
    let answers = seal_at
        .copies
        .iter()
        .map(|&node_id| {
            let sealed = run.seal_succeeds.contains(&node_id);
            let end_offset = if sealed { seal_at.end } else { 0 };
            CopyEnd { node_id, end_offset, data_bytes: end_offset * 10, sealed }
        })
        .collect();
    match failover.sealed(answers) {
        Ok(sealed) => Outcome::Done { fill, seal_at, sealed },
        Err(refusal) => Outcome::Refused(refusal.what),
    }
}

fn done(source: u64, end: u64, fill: &[u64], seal: &[u64], sealed: &[u64]) -> Outcome {
    Outcome::Done {
        fill: Fill { source, end, copies: fill.to_vec() },
        seal_at: SealAt { end, copies: seal.to_vec() },
        sealed: Sealed { end_offset: end, data_bytes: end * 10, copies: sealed.to_vec() },
    }
}

#[test]
fn a_failover_seals_at_the_highest_end_of_enough_copies() {
    let all = &[1, 2, 3][..];
    let cases: Vec<(&str, Run, Outcome)> = vec![
        (
            "every copy answers: the highest end, the others filled from it",
            Run {
                answered: all,
                fenced: &[(1, 7, false), (2, 5, false), (3, 9, false)],
                filled: &[(1, 9), (2, 9)],
                seal_succeeds: all,
            },
            done(3, 9, &[1, 2], &[1, 2, 3], &[1, 2, 3]),
        ),
        (
            "this broker's copy is the source when it reaches the end",
            Run {
                answered: all,
                fenced: &[(1, 9, false), (2, 9, false), (3, 4, false)],
                filled: &[(3, 9)],
                seal_succeeds: all,
            },
            done(2, 9, &[3], &[1, 2, 3], &[1, 2, 3]),
        ),
        (
            "the primary is gone: two of three are enough",
            Run {
                answered: &[2, 3],
                fenced: &[(2, 5, false), (3, 6, false)],
                filled: &[(2, 6)],
                seal_succeeds: &[2, 3],
            },
            done(3, 6, &[2], &[2, 3], &[2, 3]),
        ),
        (
            "a fill that falls short leaves its copy out of the seal",
            Run {
                answered: all,
                fenced: &[(1, 3, false), (2, 8, false), (3, 8, false)],
                filled: &[(1, 5)],
                seal_succeeds: all,
            },
            done(2, 8, &[1], &[2, 3], &[2, 3]),
        ),
        (
            "an earlier seal decides the end; the longer copy is not cut or filled",
            Run {
                answered: all,
                fenced: &[(1, 12, false), (2, 10, true), (3, 10, true)],
                filled: &[],
                seal_succeeds: &[2, 3],
            },
            done(2, 10, &[], &[2, 3], &[2, 3]),
        ),
        (
            "one answer is too few",
            Run { answered: &[3], fenced: &[], filled: &[], seal_succeeds: &[] },
            Outcome::Refused("answer"),
        ),
        (
            "an answer from outside the replicas does not count",
            Run { answered: &[3, 7], fenced: &[], filled: &[], seal_succeeds: &[] },
            Outcome::Refused("answer"),
        ),
        (
            "one fence is too few",
            Run { answered: all, fenced: &[(3, 4, false)], filled: &[], seal_succeeds: &[] },
            Outcome::Refused("are fenced"),
        ),
        (
            "one seal is too few",
            Run {
                answered: all,
                fenced: &[(1, 4, false), (2, 4, false), (3, 4, false)],
                filled: &[],
                seal_succeeds: &[1],
            },
            Outcome::Refused("are sealed at the highest end"),
        ),
    ];
    for (name, run, expected) in cases {
        assert_eq!(drive(&run, FailoverCanaries::default()), expected, "{name}");
    }
}

#[test]
fn the_canaries_break_what_they_name() {
    let run = Run { answered: &[3], fenced: &[(3, 4, false)], filled: &[], seal_succeeds: &[3] };
    let lenient = FailoverCanaries { seal_without_enough_answers: true, ..Default::default() };
    assert_eq!(drive(&run, lenient), done(3, 4, &[], &[3], &[3]), "one answer seals");
    let run = Run {
        answered: &[1, 2, 3],
        fenced: &[(1, 9, false), (2, 5, false), (3, 7, false)],
        filled: &[],
        seal_succeeds: &[2],
    };
    let promote = FailoverCanaries { promote_follower: true, ..Default::default() };
    assert_eq!(drive(&run, promote), done(2, 5, &[], &[2], &[2]), "the shortest follower wins");
}

#[test]
#[should_panic(expected = "failover steps run in order")]
fn steps_run_in_order() {
    let mut failover = Failover::new(vec![1, 2, 3], 1, FailoverCanaries::default());
    let _ = failover.fenced(copies(&[(1, false), (2, false)]));
}

#[test]
#[should_panic(expected = "failover steps run in order")]
fn a_refused_failover_takes_no_further_step() {
    let mut failover = Failover::new(vec![1, 2, 3], 1, FailoverCanaries::default());
    assert!(failover.probed(vec![1]).is_err());
    let _ = failover.fenced(copies(&[(1, false), (2, false)]));
}
