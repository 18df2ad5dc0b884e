//! Topic administration: create, delete (and the deletion of files metadata no longer lists),
//! describe, list. The moves of write heads are in `heads.rs`.

use malachi_meta::{
    CreateTopic, MetaCommand, MetaError, MetaResponse, MetaState, SegmentRoll, TopicError,
};

use crate::data::SegmentKey;
use crate::error::LogError;
use crate::node::Broker;
use crate::peer::Ask;
use crate::segments::SEGMENT_IDS_PER_COMMAND_MAX;

/// The longest a request waits for this broker to learn a topic by name (a read barrier of its
/// vnode) before it answers `metadata_unavailable`. A request that waits longer may have been
/// given up on by its client, retried elsewhere, and the topic deleted and created anew: it
/// would then take effect on the new incarnation (simulator seeds 8300276 and 2004939, a
/// produce that waited 3.5 s here landed in the topic created after its retry's). Kept well
/// under a client's request timeout (the simulator's clients wait 3 s, the Rust client's 30 s).
const NAME_WAIT_MS_MAX: u64 = 1_500;

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
    /// Creates a topic; `creator` names a non-administrator, counted by the per-user quota.
    pub async fn create_topic(
        &self,
        name: &str,
        initial_ranges: Option<u32>,
        creator: Option<&str>,
    ) -> Result<u64, LogError> {
        // A vnode's first topic claims its arc first, so its ids come from its own block.
        let vnode = self.ring.named(name);
        if vnode.group.read(|meta| meta.0.arc().is_none()) {
            self.propose_meta_named(name, MetaCommand::ClaimArc { arc: vnode.arc }).await?;
        }
        let command = MetaCommand::CreateTopic(CreateTopic {
            name: name.to_string(),
            now_ms: self.clock.now_ms(),
            initial_ranges,
            segment_roll: SegmentRoll::default(),
            replicas: self.coordination.segment_replicas(None, name.as_bytes())?,
            creator: creator.map(str::to_string),
            quota: self.config.quota(),
        });
        let MetaResponse::TopicCreated { topic_id, ranges } =
            self.propose_meta_named(name, command).await?
        else {
            unreachable!("create_topic answers TopicCreated");
        };
        let keys: Vec<SegmentKey> = ranges
            .into_iter()
            .map(|(range_id, segment_id)| SegmentKey { topic_id, range_id, segment_id })
            .collect();
        tracing::debug!(node = self.node_id, name, topic_id, "created");
        self.coordination.create_placed(&keys).await;
        Ok(topic_id)
    }

    /// Deletes a topic behind the seal-first fence: its write heads are sealed where they are
    /// held, then metadata forgets it (the name is free at once, a re-created topic gets a new
    /// id), then the files go, then metadata hears the files are gone. Without the fence, a
    /// broker whose metadata lags (cut off, or a moment behind) would go on acknowledging
    /// appends to a topic already deleted, records nobody could ever read.
    pub async fn delete_topic(&self, name: &str) -> Result<(), LogError> {
        // The incarnation a delete means is the one its name has when the request arrives. The
        // vnode's reshape lock can be held for seconds (a roll waiting out a partition), and a
        // delete that resolved the name only once it had the lock deleted an incarnation created
        // after its client gave up, retried the delete elsewhere, created the topic anew and
        // had records acknowledged there (cluster soak seed 3008454, `LostWrite`).
        self.see_topic(name).await?;
        let meant = self.topic_id(name)?;
        let _reshape = self.ring.named(name).reshape_lock.lock().await;
        let heads = self.read_meta_named(name, |meta| {
            let topic = meta.topic_by_name(name).filter(|topic| topic.topic_id == meant)?;
            let heads: Vec<SegmentKey> = topic
                .active_ranges()
                .filter_map(|range| {
                    range.active_segment_id().map(|segment_id| SegmentKey {
                        topic_id: topic.topic_id,
                        range_id: range.range_id,
                        segment_id,
                    })
                })
                .collect();
            Some(heads)
        });
        tracing::debug!(node = self.node_id, name, topic_id = meant, ?heads, "deleting");
        let Some(heads) = heads else { return Err(LogError::NoSuchTopic) };
        for &key in &heads {
            self.coordination.seal_anywhere(key).await?;
        }
        let fenced_heads = heads.iter().map(|key| key.segment_id).collect();
        let command = MetaCommand::DeleteFencedTopic { name: name.into(), fenced_heads };
        let response = self.propose_meta_named(name, command).await?;
        let MetaResponse::TopicDeleted { topic_id, .. } = response else {
            unreachable!("delete_topic answers TopicDeleted");
        };
        tracing::debug!(node = self.node_id, name, topic_id, "deleted");
        self.notifier.forget(topic_id);
        self.reclaim().await
    }

    /// Deletes this broker's files of segments metadata no longer lists, then confirms them, a
    /// bounded chunk per command, until none of its copies is pending, in every vnode. Runs
    /// after every delete and on every retention pass, on every broker, so a delete interrupted
    /// by a crash (or a broker down at the time) finishes after the restart.
    pub(crate) async fn reclaim(&self) -> Result<(), LogError> {
        for vnode in self.ring.iter() {
            self.reclaim_in(vnode).await?;
        }
        Ok(())
    }

    async fn reclaim_in(&self, vnode: &crate::vnodes::Vnode) -> Result<(), LogError> {
        loop {
            let pending: Vec<SegmentKey> = vnode.group.read(|meta| {
                meta.0
                    .pending_reclaim()
                    .iter()
                    .filter(|(_, entry)| entry.replicas.contains(&self.node_id))
                    .map(|(&segment_id, entry)| SegmentKey {
                        topic_id: entry.topic_id,
                        range_id: entry.range_id,
                        segment_id,
                    })
                    .chain(self.dropped_here(&meta.0))
                    .take(SEGMENT_IDS_PER_COMMAND_MAX)
                    .collect()
            });
            if pending.is_empty() {
                return Ok(());
            }
            for key in &pending {
                self.replicator.forget(*key);
                self.data.remove(*key).await?;
            }
            let segment_ids = pending.iter().map(|key| key.segment_id).collect();
            let node_id = Some(self.node_id);
            let command = MetaCommand::ReclaimDone { segment_ids, node_id };
            vnode.group.propose(command).await?.map_err(map_meta_error)?;
        }
    }

    /// Whether this broker still holds files of a replica that was dropped (moved elsewhere).
    pub(crate) fn holds_dropped_copies(&self) -> bool {
        self.ring
            .iter()
            .any(|vnode| vnode.group.read(|meta| self.dropped_here(&meta.0).next().is_some()))
    }

    /// Retained segments whose replica here was dropped (moved to another broker) and whose
    /// files are still to be deleted.
    fn dropped_here<'a>(&self, meta: &'a MetaState) -> impl Iterator<Item = SegmentKey> + 'a {
        let node_id = self.node_id;
        meta.segments().filter(move |segment| segment.dropped.contains(&node_id)).map(|segment| {
            SegmentKey {
                topic_id: segment.topic_id,
                range_id: segment.range_id,
                segment_id: segment.segment_id,
            }
        })
    }

    /// A topic's ranges with their record counts. An active segment that cannot be opened
    /// (damaged), or whose holder cannot be reached, counts as empty here; reads of it answer
    /// why.
    pub async fn describe_topic(&self, name: &str) -> Result<TopicInfo, LogError> {
        self.see_topic(name).await?;
        let (mut info, heads) = self.read_meta_named(name, |meta| {
            let topic = meta.topic_by_name(name).ok_or(LogError::NoSuchTopic)?;
            let mut heads = Vec::new();
            let ranges = topic
                .ranges
                .values()
                .map(|range| {
                    let segments = meta.range_segments(topic.topic_id, range.range_id);
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
            let records = self.segment_end(key).await.ok().flatten().map_or(0, |end| end.offset);
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

    /// Splits a range (an operator's request): carried out by the coordinator, here or on the
    /// leader. Returns the two halves.
    pub async fn split(&self, topic: &str, range_id: u32) -> Result<[u32; 2], LogError> {
        self.see_topic(topic).await?;
        let topic_id = self.topic_id(topic)?;
        let ranges = self.coordination.reshape(Ask::Split { topic_id, range_id }).await?;
        ranges.try_into().map_err(|_| LogError::Unavailable("a split answered no halves".into()))
    }

    /// Merges two buddy ranges (an operator's request), as [`Broker::split`].
    pub async fn merge(&self, topic: &str, left: u32, right: u32) -> Result<u32, LogError> {
        self.see_topic(topic).await?;
        let topic_id = self.topic_id(topic)?;
        let ranges = self.coordination.reshape(Ask::Merge { topic_id, left, right }).await?;
        ranges.first().copied().ok_or(LogError::Unavailable("a merge answered no range".into()))
    }

    /// Rolls a range's head now (an operator's or a test's request): here when this broker
    /// leads the topic's vnode, else asked of the leader, which rolls it shortly.
    pub async fn roll(&self, topic_id: u64, range_id: u32) -> Result<(), LogError> {
        self.coordination.roll(topic_id, range_id).await
    }

    /// Segment rolls requested and not finished yet.
    pub fn rolls_pending(&self) -> usize {
        self.coordination.rolls_pending()
    }

    /// Every topic's name, sorted.
    pub fn list_topics(&self) -> Vec<String> {
        let mut names =
            self.read_every_meta(|meta| meta.topics().map(|topic| topic.name.clone()).collect());
        names.sort();
        names
    }

    /// In a cluster, a topic unknown here may only be unknown *yet*: created a moment ago
    /// through another broker and not applied here. A read barrier catches this broker up
    /// before a caller answers `no_such_topic` (a client that created a topic through one broker
    /// may produce to it through another at once). If the barrier cannot be taken (no leader
    /// reachable), the answer is `metadata_unavailable`, never a definite `no_such_topic`: a
    /// client told a topic does not exist may act on it (delete is done, create anew).
    ///
    /// A topic known here is resolved from this broker's copy only once that copy has caught
    /// up under the vnode's current leadership (`Vnode::caught_up`): a broker back from a
    /// restart, or from an election it may have been cut off for, first takes one barrier, so
    /// it never reads, deletes or appends to an older incarnation of a re-created topic (found
    /// by the cluster simulator: seeds 21789, 21804 and 21843). The wait is bounded by
    /// [`NAME_WAIT_MS_MAX`].
    pub(crate) async fn see_topic(&self, name: &str) -> Result<(), LogError> {
        if self.cluster.is_none() {
            return Ok(());
        }
        let vnode = self.ring.named(name);
        let unknown = self.read_meta_named(name, |meta| meta.topic_by_name(name).is_none());
        if !unknown && vnode.caught_up() {
            return Ok(());
        }
        let why = if unknown {
            "unknown here"
        } else {
            "not caught up here since a restart or an election"
        };
        let wait = std::time::Duration::from_millis(NAME_WAIT_MS_MAX);
        match tokio::time::timeout(wait, vnode.catch_up()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                Err(LogError::Unavailable(format!("topic {name} {why}, and {error}")))
            }
            Err(_) => Err(LogError::Unavailable(format!(
                "topic {name} {why}, and its metadata did not catch up within {NAME_WAIT_MS_MAX} ms"
            ))),
        }
    }

    pub(crate) fn topic_id(&self, name: &str) -> Result<u64, LogError> {
        self.read_meta_named(name, |meta| meta.topic_by_name(name).map(|topic| topic.topic_id))
            .ok_or(LogError::NoSuchTopic)
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
