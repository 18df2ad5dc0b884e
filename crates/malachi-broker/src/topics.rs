//! Topic administration and the write-head operations behind the seal-first fence: create,
//! delete, describe, roll, split, merge, retention.
//!
//! Every operation that moves a write head follows one order: seal the segment in the data
//! plane (the fence: the store refuses appends from then on, also after a restart), then record
//! the reported end in metadata, then create the files of the new segments. A crash between two
//! steps leaves a sealed head that metadata still calls active; the next produce to it finds the
//! fence and completes the step as a roll (`heal_sealed_head`).

use malachi_meta::placement::{self, Candidate, Constraints};
use malachi_meta::{
    CreateTopic, MergeRanges, MetaCommand, MetaError, MetaResponse, RangeError, RollSegment,
    SealReport, SegmentRef, SegmentRoll, SplitRange, TopicError,
};

use crate::data::SegmentKey;
use crate::error::LogError;
use crate::node::Broker;
use crate::segments::SEGMENT_IDS_PER_COMMAND_MAX;

/// A topic as `describe` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub topic_id: u64,
    pub created_ms: u64,
    pub policy: Option<String>,
    pub ranges: Vec<RangeInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeInfo {
    pub range_id: u32,
    pub start: u64,
    pub end_inclusive: u64,
    pub active: bool,
    pub parents: Vec<u32>,
    pub children: Vec<u32>,
    pub segments: u32,
    /// Records retained (sealed segments' lengths plus the active segment's durable end).
    pub records: u64,
    pub expired_records: u64,
}

impl Broker {
    pub(crate) async fn propose_meta(
        &self,
        command: MetaCommand,
    ) -> Result<MetaResponse, LogError> {
        self.meta.propose(command).await?.map_err(map_meta_error)
    }

    /// Creates a topic; `creator` names a non-administrator, counted by the per-user quota.
    pub async fn create_topic(
        &self,
        name: &str,
        initial_ranges: Option<u32>,
        creator: Option<&str>,
    ) -> Result<u64, LogError> {
        let command = MetaCommand::CreateTopic(CreateTopic {
            name: name.to_string(),
            now_ms: self.clock.now_ms(),
            initial_ranges,
            segment_roll: SegmentRoll::default(),
            replicas: self.segment_replicas(name.as_bytes()),
            creator: creator.map(str::to_string),
            quota: self.config.quota(),
        });
        let MetaResponse::TopicCreated { topic_id, ranges } = self.propose_meta(command).await?
        else {
            unreachable!("create_topic answers TopicCreated");
        };
        let keys: Vec<SegmentKey> = ranges
            .into_iter()
            .map(|(range_id, segment_id)| SegmentKey { topic_id, range_id, segment_id })
            .collect();
        self.create_segments(&keys).await?;
        Ok(topic_id)
    }

    /// Deletes a topic: metadata first (the name is free at once, a re-created topic gets a new
    /// id), then the files, then metadata hears the files are gone.
    pub async fn delete_topic(&self, name: &str) -> Result<(), LogError> {
        let _reshape = self.reshape_lock.lock().await;
        let response = self.propose_meta(MetaCommand::DeleteTopic { name: name.into() }).await?;
        let MetaResponse::TopicDeleted { topic_id, .. } = response else {
            unreachable!("delete_topic answers TopicDeleted");
        };
        self.notifier.forget(topic_id);
        self.reclaim().await
    }

    /// Deletes this broker's files of segments metadata no longer lists, then confirms them, a
    /// bounded chunk per command, until none of its copies is pending. Runs after every delete
    /// and on every retention pass, on every broker, so a delete interrupted by a crash (or a
    /// broker down at the time) finishes after the restart.
    pub(crate) async fn reclaim(&self) -> Result<(), LogError> {
        loop {
            let pending: Vec<SegmentKey> = self.meta.read(|meta| {
                meta.0
                    .pending_reclaim()
                    .iter()
                    .filter(|(_, entry)| entry.replicas.contains(&self.node_id))
                    .take(SEGMENT_IDS_PER_COMMAND_MAX)
                    .map(|(&segment_id, entry)| SegmentKey {
                        topic_id: entry.topic_id,
                        range_id: entry.range_id,
                        segment_id,
                    })
                    .collect()
            });
            if pending.is_empty() {
                return Ok(());
            }
            for key in &pending {
                self.data.remove(*key).await?;
            }
            let segment_ids = pending.iter().map(|key| key.segment_id).collect();
            let node_id = Some(self.node_id);
            self.propose_meta(MetaCommand::ReclaimDone { segment_ids, node_id }).await?;
        }
    }

    /// A topic's ranges with their record counts. An active segment that cannot be opened
    /// (damaged) counts as empty here; reads of it answer the damage.
    pub async fn describe_topic(&self, name: &str) -> Result<TopicInfo, LogError> {
        let (mut info, heads) = self.meta.read(|meta| {
            let topic = meta.0.topic_by_name(name).ok_or(LogError::NoSuchTopic)?;
            let mut heads = Vec::new();
            let ranges = topic
                .ranges
                .values()
                .map(|range| {
                    let segments = meta.0.range_segments(topic.topic_id, range.range_id);
                    let mut records = 0;
                    for segment in &segments {
                        match segment.sealed_length() {
                            Some((end_offset, _)) => records += end_offset,
                            None => heads.push((range.range_id, segment.segment_id)),
                        }
                    }
                    RangeInfo {
                        range_id: range.range_id,
                        start: range.extent.start,
                        end_inclusive: range.extent.end_inclusive,
                        active: range.is_active(),
                        parents: range.parents.clone(),
                        children: range.children.clone(),
                        segments: segments.len() as u32,
                        records,
                        expired_records: range.expired_records,
                    }
                })
                .collect();
            let info = TopicInfo {
                name: topic.name.clone(),
                topic_id: topic.topic_id,
                created_ms: topic.created_ms,
                policy: topic.policy.clone(),
                ranges,
            };
            Ok::<_, LogError>((info, heads))
        })?;
        for (range_id, segment_id) in heads {
            let key = SegmentKey { topic_id: info.topic_id, range_id, segment_id };
            let records = self.active_durable_end(key).await.unwrap_or(0);
            if let Some(range) = info.ranges.iter_mut().find(|range| range.range_id == range_id) {
                range.records += records;
            }
        }
        Ok(info)
    }

    /// Fetches of `topic` parked now, waiting for a produce.
    pub fn parked_fetches(&self, topic: &str) -> usize {
        self.topic_id(topic).map_or(0, |topic_id| self.notifier.parked(topic_id))
    }

    /// Segment rolls requested and not finished yet.
    pub fn rolls_pending(&self) -> usize {
        self.rolling.lock().expect("rolling lock poisoned").len()
    }

    pub fn list_topics(&self) -> Vec<String> {
        self.meta.read(|meta| meta.0.topics().map(|topic| topic.name.clone()).collect())
    }

    /// Seals a range's write head in the data plane and returns the report metadata records.
    async fn fence(&self, topic_id: u64, range_id: u32) -> Result<SealReport, LogError> {
        let segment_id = self.head_segment(topic_id, range_id)?;
        let key = SegmentKey { topic_id, range_id, segment_id };
        let segment = self.segment(key).await?;
        let info = self.data.seal(std::sync::Arc::clone(&segment)).await.map_err(|error| {
            // A failed seal poisons the head: forget the handle so the next use recovers the
            // file from what is on the disk, and the fence can be tried again.
            tracing::error!(?key, %error, "sealing a write head failed on storage");
            self.data.evict_poisoned(key, &segment);
            LogError::Storage {
                reason: "unfenced",
                detail: format!("the write head of range {range_id} could not be sealed: {error}"),
            }
        })?;
        Ok(SealReport { segment_id, end_offset: info.end_offset, data_bytes: info.data_bytes })
    }

    /// The active segment of a range: `no_such_range` for a range the topic never had,
    /// `range_sealed` for one that split or merged.
    fn head_segment(&self, topic_id: u64, range_id: u32) -> Result<u64, LogError> {
        self.meta.read(|meta| {
            let topic = meta.0.topic(topic_id).ok_or(LogError::NoSuchTopic)?;
            let range = topic
                .ranges
                .get(&range_id)
                .ok_or(LogError::Meta(MetaError::Range(RangeError::NoSuchRange { range_id })))?;
            range
                .active_segment_id()
                .ok_or(LogError::Meta(MetaError::Range(RangeError::RangeSealed { range_id })))
        })
    }

    /// The skip-split-fence canary's "seal": the head's durable end now, with the head left
    /// open for the appends already routed to it.
    async fn canary_unfenced_end(
        &self,
        topic_id: u64,
        range_id: u32,
    ) -> Result<SealReport, LogError> {
        let segment_id = self.head_segment(topic_id, range_id)?;
        let status = self.segment(SegmentKey { topic_id, range_id, segment_id }).await?.status();
        Ok(SealReport {
            segment_id,
            end_offset: status.durable_offset,
            data_bytes: status.durable_bytes,
        })
    }

    /// Rolls a range's active segment: seal it, record the end, open the next one.
    pub async fn roll(&self, topic_id: u64, range_id: u32) -> Result<(), LogError> {
        let _reshape = self.reshape_lock.lock().await;
        self.roll_locked(topic_id, range_id).await
    }

    async fn roll_locked(&self, topic_id: u64, range_id: u32) -> Result<(), LogError> {
        let seal = self.fence(topic_id, range_id).await?;
        self.record_roll(topic_id, range_id, seal).await
    }

    async fn record_roll(
        &self,
        topic_id: u64,
        range_id: u32,
        seal: SealReport,
    ) -> Result<(), LogError> {
        let now_ms = self.clock.now_ms();
        let command = MetaCommand::RollSegment(RollSegment {
            topic_id,
            range_id,
            seal,
            now_ms,
            replicas: self.segment_replicas(&placement_object(topic_id, range_id, now_ms)),
        });
        let MetaResponse::SegmentRolled { segment_id, .. } = self.propose_meta(command).await?
        else {
            unreachable!("roll answers SegmentRolled");
        };
        self.create_segments(&[SegmentKey { topic_id, range_id, segment_id }]).await
    }

    /// A produce found `segment_id` sealed while metadata still calls it the head of `range_id`:
    /// an earlier roll, split or merge sealed it and stopped (a crash, a refused command).
    /// Completes it as a roll, so the range takes writes again.
    pub(crate) async fn heal_sealed_head(
        &self,
        topic_id: u64,
        range_id: u32,
        segment_id: u64,
    ) -> Result<(), LogError> {
        let _reshape = self.reshape_lock.lock().await;
        let still_head = self.meta.read(|meta| {
            meta.0
                .topic(topic_id)
                .and_then(|topic| topic.ranges.get(&range_id))
                .and_then(|range| range.active_segment_id())
                == Some(segment_id)
        });
        if !still_head {
            return Ok(());
        }
        let segment = self.segment(SegmentKey { topic_id, range_id, segment_id }).await?;
        let Some(info) = segment.status().sealed else {
            return Ok(());
        };
        let seal =
            SealReport { segment_id, end_offset: info.end_offset, data_bytes: info.data_bytes };
        self.record_roll(topic_id, range_id, seal).await
    }

    /// Splits a range at its midpoint behind the seal-first fence. Returns the children.
    pub async fn split(&self, topic: &str, range_id: u32) -> Result<[u32; 2], LogError> {
        let _reshape = self.reshape_lock.lock().await;
        let topic_id = self.topic_id(topic)?;
        self.split_locked(topic_id, range_id).await
    }

    pub(crate) async fn split_locked(
        &self,
        topic_id: u64,
        range_id: u32,
    ) -> Result<[u32; 2], LogError> {
        let seal = if self.canaries.skip_split_fence {
            self.canary_unfenced_end(topic_id, range_id).await?
        } else {
            self.fence(topic_id, range_id).await?
        };
        let now_ms = self.clock.now_ms();
        let child = |child: u8| {
            let mut object = placement_object(topic_id, range_id, now_ms);
            object.push(child);
            self.segment_replicas(&object)
        };
        let command = MetaCommand::SplitRange(SplitRange {
            topic_id,
            range_id,
            seal: Some(seal),
            now_ms,
            child_replicas: [child(0), child(1)],
            quota: self.config.quota(),
        });
        match self.propose_meta(command).await {
            Ok(MetaResponse::RangeSplit { children, child_segment_ids, .. }) => {
                let keys: Vec<SegmentKey> = children
                    .into_iter()
                    .zip(child_segment_ids)
                    .map(|(range_id, segment_id)| SegmentKey { topic_id, range_id, segment_id })
                    .collect();
                self.create_segments(&keys).await?;
                self.mark_reshaped(topic_id);
                Ok(children)
            }
            Ok(other) => unreachable!("split answered {other:?}"),
            Err(refused) => {
                // The head is fenced but the split was refused (a limit): roll, so the range
                // keeps taking writes, and report the refusal.
                self.record_roll(topic_id, range_id, seal).await?;
                Err(refused)
            }
        }
    }

    /// Merges two active buddy ranges behind the seal-first fence of both. Returns the new range.
    pub async fn merge(&self, topic: &str, left: u32, right: u32) -> Result<u32, LogError> {
        let _reshape = self.reshape_lock.lock().await;
        let topic_id = self.topic_id(topic)?;
        self.merge_locked(topic_id, left, right).await
    }

    pub(crate) async fn merge_locked(
        &self,
        topic_id: u64,
        left: u32,
        right: u32,
    ) -> Result<u32, LogError> {
        self.check_buddies(topic_id, left, right)?;
        let left_seal = self.fence(topic_id, left).await?;
        let right_seal = match self.fence(topic_id, right).await {
            Ok(seal) => seal,
            Err(error) => {
                self.record_roll(topic_id, left, left_seal).await?;
                return Err(error);
            }
        };
        let now_ms = self.clock.now_ms();
        let command = MetaCommand::MergeRanges(MergeRanges {
            topic_id,
            range_ids: [left, right],
            seals: [Some(left_seal), Some(right_seal)],
            now_ms,
            replicas: self.segment_replicas(&placement_object(topic_id, left, now_ms)),
        });
        match self.propose_meta(command).await {
            Ok(MetaResponse::RangesMerged { range_id, segment_id, .. }) => {
                self.create_segments(&[SegmentKey { topic_id, range_id, segment_id }]).await?;
                self.mark_reshaped(topic_id);
                Ok(range_id)
            }
            Ok(other) => unreachable!("merge answered {other:?}"),
            Err(refused) => {
                self.record_roll(topic_id, left, left_seal).await?;
                self.record_roll(topic_id, right, right_seal).await?;
                Err(refused)
            }
        }
    }

    /// Refuses a merge of non-buddies before fencing anything.
    fn check_buddies(&self, topic_id: u64, left: u32, right: u32) -> Result<(), LogError> {
        self.meta.read(|meta| {
            let topic = meta.0.topic(topic_id).ok_or(LogError::NoSuchTopic)?;
            let extent = |range_id: u32| {
                let range = topic.ranges.get(&range_id).ok_or(LogError::Meta(MetaError::Range(
                    RangeError::NoSuchRange { range_id },
                )))?;
                if !range.is_active() {
                    return Err(LogError::Meta(MetaError::Range(RangeError::RangeSealed {
                        range_id,
                    })));
                }
                Ok(range.extent)
            };
            let (low, high) = (extent(left)?, extent(right)?);
            if low.buddy() == Some(high) {
                Ok(())
            } else {
                Err(LogError::Meta(MetaError::Range(RangeError::NotBuddies {
                    first: left,
                    second: right,
                })))
            }
        })
    }

    /// The replicas of a segment this node is about to create, for `object` (what the command
    /// creates: a topic's name, a range and a time). Every placement goes through
    /// `malachi_meta::placement`; until brokers find each other (the cluster issue) this node is
    /// the only live broker and each segment has one replica.
    fn segment_replicas(&self, object: &[u8]) -> Vec<u64> {
        let live =
            [Candidate { broker_id: self.node_id, attributes: self.config.attributes.clone() }];
        placement::place(object, 1, &live, &[], &Constraints::default())
            .expect("one replica on the one live broker always places")
            .brokers
    }

    fn mark_reshaped(&self, topic_id: u64) {
        let now_ms = self.clock.now_ms();
        self.last_reshape_ms.lock().expect("reshape clock lock poisoned").insert(topic_id, now_ms);
    }

    pub(crate) fn topic_id(&self, name: &str) -> Result<u64, LogError> {
        self.meta
            .read(|meta| meta.0.topic_by_name(name).map(|topic| topic.topic_id))
            .ok_or(LogError::NoSuchTopic)
    }

    /// One retention pass: expire what the bound policies allow, then delete the files.
    pub async fn run_retention(&self) -> Result<u64, LogError> {
        let _reshape = self.reshape_lock.lock().await;
        let now_ms = self.clock.now_ms();
        let defaults = malachi_meta::RetentionDefaults {
            max_age_ms: self.config.retention_max_age_ms,
            max_bytes: self.config.retention_max_bytes,
            unresolved_policy_max_age_ms: self.config.retention_unresolved_policy_max_age_ms,
        };
        // One broker expires segments in metadata (the vnode's leader); every broker removes
        // its own files of expired segments below.
        let plan: Vec<SegmentRef> = if self.meta.is_leader() {
            self.meta.read(|meta| meta.0.retention_plan(now_ms, &defaults))
        } else {
            Vec::new()
        };
        let mut expired_records = 0;
        for chunk in plan.chunks(SEGMENT_IDS_PER_COMMAND_MAX) {
            let command = MetaCommand::ExpireSegments { segments: chunk.to_vec() };
            let MetaResponse::SegmentsExpired { expired_records: count, .. } =
                self.propose_meta(command).await?
            else {
                unreachable!("expire answers SegmentsExpired");
            };
            expired_records += count;
        }
        // Also with nothing expired now: files of a topic deleted before a crash are still
        // pending, and this is where they go.
        self.reclaim().await?;
        Ok(expired_records)
    }
}

pub(crate) fn map_meta_error(error: MetaError) -> LogError {
    match error {
        MetaError::Topic(TopicError::NoSuchTopic) => LogError::NoSuchTopic,
        MetaError::Topic(TopicError::InvalidTopicName) => LogError::InvalidTopicName,
        MetaError::Topic(TopicError::AlreadyExists) => LogError::AlreadyExists,
        other => LogError::Meta(other),
    }
}

/// What placement hashes for a segment a range gets at `now_ms`.
fn placement_object(topic_id: u64, range_id: u32, now_ms: u64) -> Vec<u8> {
    [&topic_id.to_le_bytes()[..], &range_id.to_le_bytes(), &now_ms.to_le_bytes()].concat()
}
