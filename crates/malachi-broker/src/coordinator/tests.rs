use malachi_meta::{CreateTopic, MetaCommand, MetaResponse};

use super::*;

const NOW_MS: u64 = 1_000_000;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        load: LoadConfig {
            window_ms: 10_000,
            split_records_per_s: 100,
            merge_records_per_s: 10,
            cooldown_ms: 1_000,
            ..LoadConfig::default()
        },
        retention_interval_ms: 5_000,
        retention: RetentionDefaults {
            max_age_ms: None,
            max_bytes: None,
            unresolved_policy_max_age_ms: None,
        },
    }
}

/// A topic `orders` with two ranges (0 and 1), created long before `NOW_MS`.
fn meta() -> (MetaState, u64) {
    let mut meta = MetaState::default();
    let created = meta.apply(MetaCommand::CreateTopic(CreateTopic {
        name: "orders".into(),
        now_ms: 1,
        initial_ranges: Some(2),
        segment_roll: Default::default(),
        replicas: vec![1],
        creator: None,
        quota: Default::default(),
    }));
    let Ok(MetaResponse::TopicCreated { topic_id, .. }) = created else { panic!("{created:?}") };
    (meta, topic_id)
}

/// A hot range 0 and a moderate range 1, so that nothing merges and range 0 splits.
fn hot(topic_id: u64) -> Vec<((u64, u32), Rate)> {
    let rate = |records_per_s| Rate { records_per_s, bytes_per_s: 0 };
    vec![((topic_id, 0), rate(500)), ((topic_id, 1), rate(50))]
}

#[test]
fn only_the_leader_decides_and_each_decision_names_its_term() {
    let (meta, topic) = meta();
    let roll = |range_id| Action::Roll { topic_id: topic, range_id };
    let mut coordinator = Coordinator::new(config(), false);
    // (leads, term, the term a roll is asked in, rolls asked, expected rolls)
    type Case = (bool, u64, u64, Vec<u32>, Vec<Action>);
    let cases: Vec<Case> = vec![
        (false, 3, 3, vec![0], vec![]),
        (true, 3, 3, vec![0, 0, 1], vec![roll(0), roll(1)]),
        // Both ranges are still rolling: asked again, nothing new.
        (true, 3, 3, vec![0], vec![]),
        // A request carried over from another term is not acted on.
        (true, 3, 2, vec![0], vec![]),
        // Deposed, then leading again in a later term: the old operations are forgotten.
        (false, 4, 4, vec![1], vec![]),
        (true, 5, 5, vec![1], vec![roll(1)]),
    ];
    for (step, (leads, term, asked_in, rolls, expected)) in cases.into_iter().enumerate() {
        coordinator.leadership(leads, term);
        let decisions: Vec<Decision> = rolls
            .into_iter()
            .filter_map(|range_id| coordinator.roll_wanted(&meta, topic, range_id, asked_in))
            .collect();
        let actions: Vec<Action> = decisions.iter().map(|d| d.action.clone()).collect();
        assert_eq!(actions, expected, "step {step}");
        assert!(decisions.iter().all(|decision| decision.term == term), "step {step}");
        // Ticks decide no rolls, and nothing for a range that is rolling.
        coordinator.load_report(1, &hot(topic), NOW_MS);
        let ticked = coordinator.tick(&meta, &Default::default(), NOW_MS);
        assert!(ticked.iter().all(|decision| decision.action.ranges().is_empty()), "{ticked:?}");
    }
}

#[test]
fn load_reports_drive_splits_and_go_stale() {
    let (meta, topic) = meta();
    let mut coordinator = Coordinator::new(config(), false);
    coordinator.leadership(true, 1);
    coordinator.load_report(1, &hot(topic), NOW_MS);
    let split = Action::Split { topic_id: topic, range_id: 0 };
    let decided: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), NOW_MS)
        .into_iter()
        .map(|decision| decision.action)
        .collect();
    assert_eq!(decided, vec![split.clone()]);
    // While the split runs the topic is left alone; once it finished, the cooldown holds.
    assert_eq!(coordinator.tick(&meta, &Default::default(), NOW_MS + 1), vec![]);
    coordinator.finished(&split, NOW_MS + 2);
    coordinator.load_report(1, &hot(topic), NOW_MS + 2);
    assert_eq!(coordinator.tick(&meta, &Default::default(), NOW_MS + 500), vec![]);
    // Past the cooldown, a report two windows old counts for nothing: both ranges look cold and
    // the buddies merge.
    let later = NOW_MS + 2 + 20_001;
    let decided: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), later)
        .into_iter()
        .map(|decision| decision.action)
        .collect();
    assert_eq!(decided, vec![Action::Merge { topic_id: topic, left: 0, right: 1 }]);
}

#[test]
fn an_operators_reshape_claims_its_ranges() {
    let (meta, topic) = meta();
    let mut coordinator = Coordinator::new(config(), false);
    coordinator.leadership(true, 2);
    let merge = Action::Merge { topic_id: topic, left: 0, right: 1 };
    assert!(coordinator.claim(&merge));
    assert!(!coordinator.claim(&Action::Split { topic_id: topic, range_id: 1 }));
    assert_eq!(coordinator.roll_wanted(&meta, topic, 0, 2), None, "the merge holds both ranges");
    assert_eq!(coordinator.tick(&meta, &Default::default(), NOW_MS), vec![]);
    coordinator.finished(&merge, NOW_MS);
    assert!(coordinator.claim(&Action::Split { topic_id: topic, range_id: 1 }));
}

#[test]
fn retention_runs_once_per_interval_on_the_leader() {
    let (mut meta, topic) = meta();
    // Roll range 0 so that it has a sealed segment to expire.
    let segment_id = meta.topic(topic).unwrap().ranges[&0].active_segment_id().unwrap();
    let seal = malachi_meta::SealReport { segment_id, end_offset: 10, data_bytes: 100 };
    let roll = malachi_meta::RollSegment {
        topic_id: topic,
        range_id: 0,
        seal,
        now_ms: 2,
        replicas: vec![1],
    };
    meta.apply(MetaCommand::RollSegment(roll)).unwrap();
    let mut config = config();
    config.retention.max_age_ms = Some(1);
    let mut coordinator = Coordinator::new(config, false);
    assert_eq!(coordinator.tick(&meta, &Default::default(), NOW_MS), vec![], "not the leader");
    coordinator.leadership(true, 1);
    let expire =
        Action::Expire { segments: vec![SegmentRef { topic_id: topic, range_id: 0, segment_id }] };
    let due: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), NOW_MS)
        .into_iter()
        .map(|d| d.action)
        .collect();
    assert!(due.contains(&expire), "{due:?}");
    let soon: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), NOW_MS + 4_999)
        .into_iter()
        .map(|d| d.action)
        .collect();
    assert!(!soon.contains(&expire));
    let later: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), NOW_MS + 5_000)
        .into_iter()
        .map(|d| d.action)
        .collect();
    assert!(later.contains(&expire));
}

/// The canary keeps deciding in the last term it led: exactly the bug the simulator must catch.
#[test]
fn the_deposed_canary_keeps_deciding() {
    let (meta, topic) = meta();
    for (canary, expected) in [(false, 0), (true, 1)] {
        let mut coordinator = Coordinator::new(config(), canary);
        coordinator.leadership(true, 7);
        coordinator.leadership(false, 8);
        let decisions: Vec<Decision> =
            coordinator.roll_wanted(&meta, topic, 0, 7).into_iter().collect();
        assert_eq!(decisions.len(), expected, "canary {canary}");
        assert!(decisions.iter().all(|decision| decision.term == 7));
    }
}

/// A range's head moves between brokers as it rolls: its rate is what all of them reported.
#[test]
fn a_ranges_rate_sums_every_brokers_report() {
    let (meta, topic) = meta();
    let mut coordinator = Coordinator::new(config(), false);
    coordinator.leadership(true, 1);
    let rate = |records_per_s| Rate { records_per_s, bytes_per_s: 0 };
    // Each broker alone is under the split threshold of 100/s; together they are over it.
    let range_1 = ((topic, 1), rate(50));
    coordinator.load_report(1, &[((topic, 0), rate(60)), range_1], NOW_MS);
    assert_eq!(coordinator.tick(&meta, &Default::default(), NOW_MS), vec![]);
    coordinator.load_report(2, &[((topic, 0), rate(60))], NOW_MS);
    let decided: Vec<Action> = coordinator
        .tick(&meta, &Default::default(), NOW_MS)
        .into_iter()
        .map(|d| d.action)
        .collect();
    assert_eq!(decided, vec![Action::Split { topic_id: topic, range_id: 0 }]);
}

/// While the leadership is being handed over nothing new is decided, neither asked rolls nor
/// ticks; what was decided before stays in flight until it finishes; then deciding resumes.
#[test]
fn a_coordinator_handing_over_decides_nothing_new() {
    let (meta, topic) = meta();
    let mut coordinator = Coordinator::new(config(), false);
    coordinator.leadership(true, 3);
    let first = coordinator.roll_wanted(&meta, topic, 0, 3).expect("a roll while leading");
    coordinator.hand_over(true);
    assert_eq!(coordinator.deciding_term(), None);
    assert!(coordinator.roll_wanted(&meta, topic, 1, 3).is_none(), "no roll while handing over");
    coordinator.load_report(1, &hot(topic), NOW_MS);
    assert!(coordinator.tick(&meta, &Default::default(), NOW_MS).is_empty());
    assert!(!coordinator.is_idle(), "the roll decided before is still in flight");
    coordinator.finished(&first.action, NOW_MS);
    assert!(coordinator.is_idle());
    coordinator.hand_over(false);
    assert!(coordinator.roll_wanted(&meta, topic, 1, 3).is_some(), "deciding again");
}
