use super::*;

fn facts(replicas: &[u64], settled_on: &[u64], moving_off: &[u64], short: bool) -> Facts {
    Facts {
        replicas: replicas.to_vec(),
        settled_on: settled_on.to_vec(),
        moving_off: moving_off.to_vec(),
        short,
    }
}

/// Brokers 1 to 9 alive but those named dead or lost.
fn health(dead: &'static [u64], lost: &'static [u64]) -> impl Fn(u64) -> Health {
    move |node| match (dead.contains(&node), lost.contains(&node)) {
        (_, true) => Health::Lost,
        (true, false) => Health::Dead,
        (false, false) => Health::Alive,
    }
}

fn settle(replica: u64, sources: &[u64]) -> Step {
    Step::Settle { replica, sources: sources.to_vec() }
}

#[test]
fn healing_settles_moves_and_grows_what_it_should() {
    // (case, the segment, dead brokers, lost brokers, whether it needs healing, the plan)
    type Case = (&'static str, Facts, &'static [u64], &'static [u64], bool, Vec<Step>);
    let cases: Vec<Case> = vec![
        ("whole", facts(&[1, 2, 3], &[1, 2, 3], &[], false), &[], &[], false, vec![]),
        (
            "two copies to settle, from the settled one first",
            facts(&[1, 2, 3], &[2], &[], false),
            &[],
            &[],
            true,
            vec![settle(1, &[2, 3]), settle(3, &[2, 1])],
        ),
        (
            "a dead broker's copy waits",
            facts(&[1, 2, 3], &[1, 2], &[], false),
            &[3],
            &[],
            true,
            vec![],
        ),
        (
            "a lost broker's settled replica moves",
            facts(&[1, 2, 3], &[1, 2, 3], &[], false),
            &[],
            &[3],
            true,
            vec![Step::Replace { lost: 3 }],
        ),
        (
            "a lost broker's replica already moving is left alone",
            facts(&[1, 2, 3, 4], &[1, 2, 3], &[3], false),
            &[],
            &[3],
            true,
            vec![settle(4, &[1, 2, 3])],
        ),
        (
            "a short set grows after its copies settle",
            facts(&[1, 2], &[1], &[], true),
            &[],
            &[],
            true,
            vec![settle(2, &[1]), Step::Grow],
        ),
        (
            "a short set with no settled copy waits to grow",
            facts(&[1, 2], &[], &[], true),
            &[],
            &[],
            true,
            vec![settle(1, &[2]), settle(2, &[1])],
        ),
        (
            "a short set does not grow during a move",
            facts(&[1, 2, 3], &[1, 2], &[2], true),
            &[],
            &[],
            true,
            vec![settle(3, &[1, 2])],
        ),
        ("a lone settled copy", facts(&[1], &[1], &[], false), &[], &[], false, vec![]),
    ];
    for (name, facts, dead, lost, needs, expected) in cases {
        assert_eq!(facts.needs_healing(health(dead, lost)), needs, "{name}: needs healing");
        assert_eq!(plan(&facts, health(dead, lost)), expected, "{name}");
    }
}
