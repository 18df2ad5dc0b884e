//! Test helpers: topics with a given range history, built through the real metadata machine.

use malachi_meta::Quota;
use malachi_meta::{
    CreateTopic, MergeRanges, MetaCommand, MetaResponse, MetaState, SealReport, SegmentRoll,
    SplitRange, Topic,
};

/// Builds one topic's range history by applying real commands.
pub struct TopicBuilder {
    state: MetaState,
    topic_id: u64,
    now_ms: u64,
}

impl TopicBuilder {
    pub fn new(initial_ranges: u32) -> TopicBuilder {
        let mut state = MetaState::default();
        let created = state
            .apply(MetaCommand::CreateTopic(CreateTopic {
                name: "t".into(),
                now_ms: 0,
                initial_ranges: Some(initial_ranges),
                segment_roll: SegmentRoll::default(),
                replicas: vec![1],
                creator: None,
                quota: Quota::default(),
            }))
            .expect("create topic");
        let MetaResponse::TopicCreated { topic_id, .. } = created else { panic!("{created:?}") };
        TopicBuilder { state, topic_id, now_ms: 0 }
    }

    fn seal_of(&self, range_id: u32) -> SealReport {
        let topic = self.state.topic(self.topic_id).expect("topic");
        let segment_id = topic.ranges[&range_id].active_segment_id().expect("active range");
        SealReport { segment_id, end_offset: 0, data_bytes: 32 }
    }

    pub fn split(&mut self, range_id: u32) -> [u32; 2] {
        self.now_ms += 1;
        let seal = Some(self.seal_of(range_id));
        let command = MetaCommand::SplitRange(SplitRange {
            topic_id: self.topic_id,
            range_id,
            seal,
            now_ms: self.now_ms,
            child_replicas: [vec![1], vec![1]],
            quota: Quota::default(),
        });
        match self.state.apply(command).expect("split") {
            MetaResponse::RangeSplit { children, .. } => children,
            other => panic!("{other:?}"),
        }
    }

    pub fn merge(&mut self, left: u32, right: u32) -> u32 {
        self.now_ms += 1;
        let seals = [Some(self.seal_of(left)), Some(self.seal_of(right))];
        let command = MetaCommand::MergeRanges(MergeRanges {
            topic_id: self.topic_id,
            range_ids: [left, right],
            seals,
            now_ms: self.now_ms,
            replicas: vec![1],
        });
        match self.state.apply(command).expect("merge") {
            MetaResponse::RangesMerged { range_id, .. } => range_id,
            other => panic!("{other:?}"),
        }
    }

    pub fn state(&self) -> &MetaState {
        &self.state
    }

    pub fn topic(&self) -> Topic {
        self.state.topic(self.topic_id).expect("topic").clone()
    }
}
