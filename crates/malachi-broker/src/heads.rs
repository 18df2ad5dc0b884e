//! The moves of write heads, behind the seal-first fence: roll, split, merge, and the expiry of
//! sealed segments. The coordinator (`coordinator.rs`) decides them on the vnode's leader; this
//! is how they are carried out, each in the term it was decided in.
//!
//! Every move follows one order: seal the head in the data plane, on the broker holding it (the
//! fence: the store refuses appends from then on, also after a restart), then record the
//! reported end in metadata (proposed on this node, in the decision's term, never forwarded),
//! then create the files of the new segments on the brokers placement chose. A crash between
//! two steps leaves a sealed head that metadata still calls active; the next produce to it finds
//! the fence and asks for a roll, which completes the step.

use malachi_log::canary;
use malachi_reason::Reason;
use std::sync::Arc;

use malachi_cluster::replication::replicas_fewest;
use malachi_meta::placement::{self, Candidate};
use malachi_meta::{
    MergeRanges, MetaCommand, MetaError, MetaResponse, RangeError, RollSegment, SealReport,
    SegmentRef, SplitRange,
};

use crate::coordinate::Coordination;
use crate::data::SegmentKey;
use crate::error::LogError;
use crate::gossip::PeerStatus;
use crate::peer::Remote;
use crate::segments::SEGMENT_IDS_PER_COMMAND_MAX;
use crate::topics::map_meta_error;

impl Coordination {
    /// Proposes a coordinator's command in the term it was decided in, on this node only, and
    /// wrapped with that term, so the metadata machine refuses it should it ever land after a
    /// later coordinator's (`MetaError::StaleCoordinator`). The deposed-coordinator canary
    /// forwards it instead, as a coordinator without the fence would.
    pub(crate) async fn propose_in_term(
        &self,
        term: u64,
        topic_id: u64,
        command: MetaCommand,
    ) -> Result<MetaResponse, LogError> {
        debug_assert!(command.is_coordinators(), "only the coordinator's commands: {command:?}");
        let group = &self.vnode_of(topic_id)?.group;
        let command = MetaCommand::Coordinated { term, command: Box::new(command) };
        let outcome = if canary(self.canaries.coordinate_deposed) {
            group.propose(command).await
        } else {
            group.propose_as_leader(command, term).await
        };
        outcome?.map_err(map_meta_error)
    }

    /// Rolls a range's head: seal it where it is held, record the end, open the next one.
    pub(crate) async fn roll_in(
        &self,
        term: u64,
        topic_id: u64,
        range_id: u32,
    ) -> Result<(), LogError> {
        let _reshape = self.vnode_of(topic_id)?.reshape_lock.lock().await;
        let seal = self.fence(topic_id, range_id).await?;
        self.record_roll(term, topic_id, range_id, seal).await
    }

    async fn record_roll(
        &self,
        term: u64,
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
            replicas: self
                .segment_replicas(Some(topic_id), &placement_object(topic_id, range_id, now_ms))?,
        });
        let response = self.propose_in_term(term, topic_id, command).await;
        match response {
            Ok(MetaResponse::SegmentRolled { segment_id, .. }) => {
                self.create_placed(&[SegmentKey { topic_id, range_id, segment_id }]).await;
                Ok(())
            }
            // A roll asked twice (a replayed request): the head moved already.
            Err(LogError::Meta(MetaError::Range(RangeError::AlreadySealed { .. }))) => Ok(()),
            Ok(other) => unreachable!("roll answered {other:?}"),
            Err(error) => Err(error),
        }
    }

    /// Splits a range at its midpoint behind the seal-first fence. Returns the children.
    pub(crate) async fn split_in(
        &self,
        term: u64,
        topic_id: u64,
        range_id: u32,
    ) -> Result<[u32; 2], LogError> {
        let _reshape = self.vnode_of(topic_id)?.reshape_lock.lock().await;
        let seal = if canary(self.canaries.skip_split_fence) {
            self.canary_unfenced_end(topic_id, range_id).await?
        } else {
            self.fence(topic_id, range_id).await?
        };
        let now_ms = self.clock.now_ms();
        let child = |child: u8| {
            let mut object = placement_object(topic_id, range_id, now_ms);
            object.push(child);
            self.segment_replicas(Some(topic_id), &object)
        };
        let child_replicas = [child(0)?, child(1)?];
        let command = MetaCommand::SplitRange(SplitRange {
            topic_id,
            range_id,
            seal: Some(seal),
            now_ms,
            child_replicas,
            quota: self.config.quota(),
        });
        match self.propose_in_term(term, topic_id, command).await {
            Ok(MetaResponse::RangeSplit { children, child_segment_ids, .. }) => {
                self.metrics.range_splits.inc();
                let keys: Vec<SegmentKey> = children
                    .into_iter()
                    .zip(child_segment_ids)
                    .map(|(range_id, segment_id)| SegmentKey { topic_id, range_id, segment_id })
                    .collect();
                self.create_placed(&keys).await;
                Ok(children)
            }
            Ok(other) => unreachable!("split answered {other:?}"),
            Err(refused) => {
                // The head is fenced but the split was refused (a limit): roll, so the range
                // keeps taking writes, and report the refusal.
                self.record_roll(term, topic_id, range_id, seal).await?;
                Err(refused)
            }
        }
    }

    /// Merges two active buddy ranges behind the seal-first fence of both. Returns the new
    /// range.
    pub(crate) async fn merge_in(
        &self,
        term: u64,
        topic_id: u64,
        [left, right]: [u32; 2],
    ) -> Result<u32, LogError> {
        let _reshape = self.vnode_of(topic_id)?.reshape_lock.lock().await;
        self.check_buddies(topic_id, left, right)?;
        let left_seal = self.fence(topic_id, left).await?;
        let right_seal = match self.fence(topic_id, right).await {
            Ok(seal) => seal,
            Err(error) => {
                self.record_roll(term, topic_id, left, left_seal).await?;
                return Err(error);
            }
        };
        let now_ms = self.clock.now_ms();
        let command = MetaCommand::MergeRanges(MergeRanges {
            topic_id,
            range_ids: [left, right],
            seals: [Some(left_seal), Some(right_seal)],
            now_ms,
            replicas: self
                .segment_replicas(Some(topic_id), &placement_object(topic_id, left, now_ms))?,
        });
        match self.propose_in_term(term, topic_id, command).await {
            Ok(MetaResponse::RangesMerged { range_id, segment_id, .. }) => {
                self.metrics.range_merges.inc();
                self.create_placed(&[SegmentKey { topic_id, range_id, segment_id }]).await;
                Ok(range_id)
            }
            Ok(other) => unreachable!("merge answered {other:?}"),
            Err(refused) => {
                self.record_roll(term, topic_id, left, left_seal).await?;
                self.record_roll(term, topic_id, right, right_seal).await?;
                Err(refused)
            }
        }
    }

    /// Expires `segments` (all of one vnode, whose coordinator decided it) in metadata, a
    /// bounded chunk per command; returns the records removed. Every broker deletes its own
    /// files afterwards (`reclaim`).
    pub(crate) async fn expire_in(
        &self,
        term: u64,
        segments: &[SegmentRef],
    ) -> Result<u64, LogError> {
        let Some(first) = segments.first() else { return Ok(0) };
        let vnode_id = malachi_meta::vnode_of_id(first.topic_id);
        assert!(
            segments.iter().all(|segment| malachi_meta::vnode_of_id(segment.topic_id) == vnode_id),
            "an expiry decided by one vnode names only its segments"
        );
        let _reshape = self.vnode_of(first.topic_id)?.reshape_lock.lock().await;
        let mut expired_records = 0;
        for chunk in segments.chunks(SEGMENT_IDS_PER_COMMAND_MAX) {
            let command = MetaCommand::ExpireSegments { segments: chunk.to_vec() };
            let MetaResponse::SegmentsExpired { expired_records: count, .. } =
                self.propose_in_term(term, first.topic_id, command).await?
            else {
                unreachable!("expire answers SegmentsExpired");
            };
            expired_records += count;
        }
        Ok(expired_records)
    }

    /// Seals a range's head where it is held and returns the report metadata records.
    async fn fence(&self, topic_id: u64, range_id: u32) -> Result<SealReport, LogError> {
        let segment_id = self.head_segment(topic_id, range_id)?;
        self.seal_anywhere(SegmentKey { topic_id, range_id, segment_id }).await
    }

    /// Seals segment `key` where it is held: a segment with one copy on the broker holding
    /// it; a replicated one by its primary, or by failover when the primary cannot (dead,
    /// out of reach, or failing), never by promoting another copy (`failover.rs`).
    pub(crate) async fn seal_anywhere(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        let replicated =
            self.broker().replicator.replicas(key).is_some_and(|replicas| replicas.len() > 1);
        let Some(primary) = self.holder_elsewhere(key) else {
            return self.seal_held(key).await;
        };
        if replicated && self.member_status(primary) == PeerStatus::Dead {
            tracing::info!(?key, primary, "the primary is dead: failover");
            return self.broker().replicator.seal_by_failover(key).await;
        }
        match self.remote_seal(primary, key).await {
            Ok(Remote::Done(seal)) => Ok(seal),
            Ok(Remote::FencedOrGone) => Err(LogError::Migrating),
            Err(error) if replicated => {
                tracing::warn!(?key, primary, %error, "the primary did not seal; failover");
                self.broker().replicator.seal_by_failover(key).await
            }
            Err(error) => Err(error),
        }
    }

    /// Seals `key` on this broker, which holds its one copy or is its primary.
    pub(crate) async fn seal_held(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        match self.broker().replicator.replicas(key) {
            Some(replicas) if replicas.len() > 1 => {
                self.broker().replicator.seal_as_primary(key).await
            }
            _ => self.seal_here(key).await,
        }
    }

    /// Seals `key`, held here. A failed seal poisons the head: the handle is forgotten, so
    /// the next use recovers the file from what is on the disk and the fence can be tried again.
    pub(crate) async fn seal_here(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        let segment = self.segment(key).await?;
        let info = self.data.seal(Arc::clone(&segment)).await.map_err(|error| {
            tracing::error!(?key, %error, "sealing a write head failed on storage");
            self.data.evict_poisoned(key, &segment);
            LogError::Storage {
                reason: Reason::Unfenced,
                detail: format!(
                    "the write head of range {} could not be sealed: {error}",
                    key.range_id
                ),
            }
        })?;
        Ok(SealReport {
            segment_id: key.segment_id,
            end_offset: info.end_offset,
            data_bytes: info.data_bytes,
        })
    }

    /// The active segment of a range: `no_such_range` for a range the topic never had,
    /// `range_sealed` for one that split or merged.
    fn head_segment(&self, topic_id: u64, range_id: u32) -> Result<u64, LogError> {
        self.read_meta(topic_id, |meta| {
            let topic = meta.topic(topic_id).ok_or(LogError::NoSuchTopic)?;
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

    /// Refuses a merge of non-buddies before fencing anything.
    pub(crate) fn check_buddies(
        &self,
        topic_id: u64,
        left: u32,
        right: u32,
    ) -> Result<(), LogError> {
        self.read_meta(topic_id, |meta| {
            let topic = meta.topic(topic_id).ok_or(LogError::NoSuchTopic)?;
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

    /// The replicas of a segment about to be created, for `object` (what the command creates:
    /// a topic's name, a range and a time) of `topic_id` (`None` for a topic being created):
    /// `MALACHI_LOG_REPLICATION_FACTOR` of the brokers membership holds alive and no failover
    /// found out of reach a moment ago, chosen by rendezvous hashing and spread by the topic's
    /// placement constraints. The first is the primary. A cluster of fewer brokers than the
    /// factor places on all of them (a broker alone keeps one copy); a cluster with brokers down
    /// places on fewer, but never on fewer than [`replicas_fewest`] (2 of 3): below that the new
    /// segment is refused (`no_quorum`, retryable) rather than holding acknowledged records on
    /// one disk. Hard constraints that cannot be met refuse (`placement_unmet`).
    pub(crate) fn segment_replicas(
        &self,
        topic_id: Option<u64>,
        object: &[u8],
    ) -> Result<Vec<u64>, LogError> {
        let live = self.placement_candidates();
        let wanted = self.replicas_wanted();
        let fewest = replicas_fewest(wanted);
        if live.len() < fewest {
            return Err(LogError::NoQuorum(format!(
                "a new segment needs {fewest} of its {wanted} replicas on live brokers, {} are live",
                live.len()
            )));
        }
        let replicas = wanted.min(live.len());
        let constraints = self.placement_constraints(topic_id);
        let mut placement = placement::place(object, replicas, &live, &[], &constraints)
            .map_err(|error| LogError::PlacementUnmet(error.to_string()))?;
        self.broker().handover.primary_first(&mut placement.brokers);
        Ok(placement.brokers)
    }

    /// The brokers a new replica may go to now: alive, taking new work, and not found out of
    /// reach a moment ago (this broker alone before its first registration).
    pub(crate) fn placement_candidates(&self) -> Vec<Candidate> {
        let mut live: Vec<Candidate> = self
            .cluster_view()
            .brokers
            .into_iter()
            .filter(|broker| {
                let node_id = broker.record.node_id;
                broker.status == PeerStatus::Alive
                    && self.broker().seats.takes_new_work(node_id)
                    && !self.broker().replicator.recently_unreachable(node_id)
            })
            .map(|broker| Candidate {
                broker_id: broker.record.node_id,
                attributes: broker.record.attributes,
            })
            .collect();
        if live.is_empty() {
            // Not registered yet (a broker's first boot): it is the one live broker it knows.
            live.push(Candidate {
                broker_id: self.node_id,
                attributes: self.config.attributes.clone(),
            });
        }
        live
    }

    /// The placement constraints of `topic_id`'s segments: the cluster's
    /// (`MALACHI_LOG_SPREAD_BY`, `_MIN_DOMAINS`, `_MAX_SKEW`, `_PLACEMENT_POLICY`), spread by the
    /// attribute the topic's policy names when it names one (or by none when it turns it off).
    pub(crate) fn placement_constraints(&self, topic_id: Option<u64>) -> placement::Constraints {
        let mut constraints = self.config.cluster.placement.clone();
        let Some(topic_id) = topic_id else { return constraints };
        let definitions = self.broker().admin_service.policy_definitions();
        let default = constraints.spread_by.clone();
        let spread_by = self.read_meta(topic_id, |meta| {
            let topic = meta.topic(topic_id)?;
            Some(meta.effective_spread_by(topic, &definitions, default.clone()))
        });
        if let Some(spread_by) = spread_by {
            constraints.spread_by = spread_by;
        }
        constraints
    }

    /// Creates the files of newly allocated segments on every broker holding a replica. A
    /// broker that cannot be reached is not waited for: it creates the file when the segment
    /// is first used there (a follower, when its primary ships the first batch), as metadata
    /// lists it (`Listed::ActiveUnborn`).
    pub(crate) async fn create_placed(&self, keys: &[SegmentKey]) {
        for &key in keys {
            let replicas = self.read_meta(key.segment_id, |meta| {
                meta.segment(key.segment_id).map(|segment| segment.replicas.clone())
            });
            let creates = replicas.unwrap_or_default().into_iter().map(|replica| async move {
                let created = if replica == self.node_id {
                    self.create_segments(&[key]).await
                } else {
                    self.remote_create(replica, key).await
                };
                if let Err(error) = created {
                    tracing::warn!(?key, replica, %error, "creating a new segment's file \
                        failed; it is created when first used");
                }
            });
            futures_util::future::join_all(creates).await;
        }
    }
}

/// What placement hashes for a segment a range gets at `now_ms`.
pub(crate) fn placement_object(topic_id: u64, range_id: u32, now_ms: u64) -> Vec<u8> {
    [&topic_id.to_le_bytes()[..], &range_id.to_le_bytes(), &now_ms.to_le_bytes()].concat()
}
