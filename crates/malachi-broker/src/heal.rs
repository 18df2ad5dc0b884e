//! Healing and scrubbing: every replica of a sealed segment ends up holding a settled copy,
//! the same bytes as every other, and a copy that rots is rebuilt from one that did not.
//!
//! Metadata records which replicas hold a *settled* copy (`Segment::settled_on`: sealed at the
//! recorded length with the recorded bytes, every frame intact when last checked). On the
//! vnode's leader, every maintenance tick, the healer walks the sealed replicated segments
//! that have an unsettled replica (a bounded number per tick, round-robin) and asks each such
//! replica to *settle* its copy: the replica checks it (sealed at the recorded end, the
//! recorded bytes, every frame verified) and, when it is short, longer, unsealed, damaged or
//! missing, rebuilds it from a settled copy: the first records are fetched from a settled
//! replica before anything local is deleted (a local copy goes only once a peer has shown it
//! holds an intact one), then the copy is written afresh, sealed, and compared with the
//! recorded length and bytes. The replicas that settled are recorded in one command.
//!
//! A replica on a broker dead longer than `MALACHI_REPLICA_REPLACE_AFTER_MS` moves to a live
//! broker that holds none (rendezvous hashing over the live brokers): the new broker joins the
//! replica set beside the old one, its copy is rebuilt on the next ticks, and the old replica
//! is dropped only when the new copy is recorded settled. A settled copy must remain.
//!
//! The scrubber, on every broker, re-verifies a few of the settled copies it holds every
//! `MALACHI_SCRUB_INTERVAL_MS`; a copy that fails is recorded as unsettled (readers pass over
//! it and the healer rebuilds it), never deleted by the scrub itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use malachi_log::SealInfo;
use malachi_meta::MetaCommand;
use malachi_meta::placement::{self, Candidate};
use malachi_reason::Reason;

use crate::data::{Listed, SegmentKey};
use crate::error::LogError;
use crate::gossip::PeerStatus;
use crate::node::Core;
use crate::peer::{self, DataCall, Reader, Remote};
use crate::replica::Write;
use crate::vnodes::Vnode;

mod plan;
use plan::{Facts, Health, Step};

/// Sealed segments the healer looks at per vnode and tick.
const HEAL_SEGMENTS_PER_TICK: usize = 16;
/// How long a settle may take (a rebuild copies a whole segment).
const SETTLE_TIMEOUT_MS: u64 = 120_000;
/// Records copied per read of a rebuild.
const REBUILD_RECORDS_MAX: u32 = 4_096;
/// The largest copy a rebuild gathers (it holds every record in memory before it deletes
/// anything); above `MALACHI_SEGMENT_MAX_BYTES`'s default by far.
const REBUILD_BYTES_MAX: u64 = 1 << 30;

/// A sealed segment the healer works on.
#[derive(Clone, Debug)]
struct Unsettled {
    key: SegmentKey,
    seal: SealInfo,
    /// Its replicas, their copies and moves, as healing's plan reads them.
    facts: Facts,
    /// Brokers whose dropped copies are not reclaimed yet: no candidates for a new replica.
    dropped: Vec<u64>,
}

/// The healing service: settles the copies of sealed segments (each checked, or rebuilt from
/// the others), moves replicas off dead brokers, grows replica sets back to the replication
/// factor, and scrubs this broker's settled copies. Each vnode's leader heals that vnode's
/// segments; every broker answers settles of its own copies and scrubs them.
pub struct Healer {
    core: Arc<Core>,
    /// Where the healer of each vnode this broker leads stopped (the last segment id).
    heal_cursors: Mutex<BTreeMap<u32, u64>>,
    /// When the scrubber last ran.
    last_scrub_ms: Mutex<u64>,
    /// The last segment id the scrubber verified.
    scrub_cursor: Mutex<u64>,
}

services_on_core!(Healer);

impl Healer {
    pub(crate) fn new(core: Arc<Core>) -> Healer {
        Healer {
            core,
            heal_cursors: Mutex::default(),
            last_scrub_ms: Mutex::default(),
            scrub_cursor: Mutex::default(),
        }
    }

    /// One healing pass over `vnode`, which this broker leads in `term`.
    pub(crate) async fn heal_vnode(&self, vnode: &Vnode, term: u64) {
        for segment in self.unsettled_segments(vnode) {
            self.heal_segment(term, &segment).await;
        }
    }

    /// The next sealed replicated segments of `vnode` with a replica whose copy is not settled,
    /// after the last one looked at.
    fn unsettled_segments(&self, vnode: &Vnode) -> Vec<Unsettled> {
        let after = self.heal_cursor(vnode.vnode_id());
        let wanted = self.broker().coordination.replicas_wanted();
        let found: Vec<Unsettled> = vnode.group.read(|meta| {
            let unsettled = meta
                .0
                .topics()
                .flat_map(|topic| topic.ranges.values().flat_map(|range| range.segment_ids.iter()));
            let mut found: Vec<Unsettled> = unsettled
                .filter_map(|&segment_id| {
                    let segment = meta.0.segment(segment_id)?;
                    let (end_offset, data_bytes) = segment.sealed_length()?;
                    let facts = Facts {
                        replicas: segment.replicas.clone(),
                        settled_on: segment.settled_on.clone(),
                        moving_off: segment.moves.iter().map(|move_| move_.old).collect(),
                        short: segment.staying_replicas().len() < wanted,
                    };
                    facts.needs_healing(|node| self.health(node)).then(|| Unsettled {
                        key: SegmentKey {
                            topic_id: segment.topic_id,
                            range_id: segment.range_id,
                            segment_id,
                        },
                        seal: SealInfo { end_offset, data_bytes },
                        facts,
                        dropped: segment.dropped.clone(),
                    })
                })
                .collect();
            found.sort_by_key(|segment| segment.key.segment_id);
            found
        });
        let (later, earlier): (Vec<Unsettled>, Vec<Unsettled>) =
            found.into_iter().partition(|segment| segment.key.segment_id > after);
        let next: Vec<Unsettled> =
            later.into_iter().chain(earlier).take(HEAL_SEGMENTS_PER_TICK).collect();
        if let Some(last) = next.last() {
            self.set_heal_cursor(vnode.vnode_id(), last.key.segment_id);
        }
        next
    }

    fn heal_cursor(&self, vnode_id: u32) -> u64 {
        let cursors = self.heal_cursors.lock().expect("heal cursors lock poisoned");
        cursors.get(&vnode_id).copied().unwrap_or(0)
    }

    fn set_heal_cursor(&self, vnode_id: u32, segment_id: u64) {
        let mut cursors = self.heal_cursors.lock().expect("heal cursors lock poisoned");
        cursors.insert(vnode_id, segment_id);
    }

    /// `node`'s health for healing: lost once it has been dead longer than
    /// `MALACHI_REPLICA_REPLACE_AFTER_MS`, when its replicas move elsewhere.
    fn health(&self, node: u64) -> Health {
        if self.member_status(node) != PeerStatus::Dead {
            return Health::Alive;
        }
        match self.dead_for_ms(node) >= self.config.cluster.replica_replace_after_ms {
            true => Health::Lost,
            false => Health::Dead,
        }
    }

    /// Carries out healing's plan for `segment` (`heal/plan.rs`): settles the copies it names
    /// and records the settled ones, moves replicas off lost brokers, grows a short set.
    async fn heal_segment(&self, term: u64, segment: &Unsettled) {
        let key = segment.key;
        let mut settled = Vec::new();
        let steps = plan::plan(&segment.facts, |node| self.health(node));
        let mut grow = false;
        for step in steps {
            match step {
                Step::Settle { replica, sources } => {
                    match self.settle_copy(replica, key, segment.seal, &sources).await {
                        Ok(true) => settled.push(replica),
                        Ok(false) => {
                            tracing::debug!(?key, replica, "a copy is not settled yet (no source)");
                        }
                        Err(error) => {
                            tracing::warn!(?key, replica, %error, "settling a copy failed");
                        }
                    }
                }
                Step::Replace { lost } => self.replace_replica(term, segment, lost).await,
                // Last in a plan: added once the copies settled now are recorded.
                Step::Grow => grow = true,
            }
        }
        if !settled.is_empty() {
            let command = MetaCommand::CopiesSettled {
                segment_id: key.segment_id,
                nodes: settled.clone(),
                settled: true,
            };
            match self.propose_meta(key.segment_id, command).await {
                Ok(_) => tracing::info!(?key, ?settled, "copies settled"),
                Err(error) => tracing::warn!(?key, %error, "recording settled copies failed"),
            }
        }
        if grow {
            self.add_replica(term, segment).await;
        }
    }

    /// Adds a replica to `segment`, which has fewer than it should, on a live broker chosen by
    /// placement with the replicas it has kept where they are.
    async fn add_replica(&self, term: u64, segment: &Unsettled) {
        let key = segment.key;
        let survivors: Vec<u64> = segment.facts.staying().collect();
        let Some(new) = self.new_replica_placed(segment, &survivors, survivors.len() + 1) else {
            tracing::debug!(?key, "no live broker to add a replica on yet");
            return;
        };
        let command = MetaCommand::AddReplica { segment_id: key.segment_id, new };
        match self.broker().coordination.propose_in_term(term, key.topic_id, command).await {
            Ok(_) => tracing::info!(?key, new, "a replica added: the segment had too few"),
            Err(error) => tracing::warn!(?key, new, %error, "adding a replica failed"),
        }
    }

    /// The broker placement picks for a new replica of `segment` when `survivors` keep theirs
    /// and the set is to hold `wanted`: alive, taking new work, holding no replica of it and no
    /// dropped copy waiting to be deleted.
    fn new_replica_placed(
        &self,
        segment: &Unsettled,
        survivors: &[u64],
        wanted: usize,
    ) -> Option<u64> {
        let key = segment.key;
        let live: Vec<Candidate> = self
            .cluster_view()
            .brokers
            .into_iter()
            .filter(|broker| {
                let node = broker.record.node_id;
                survivors.contains(&node)
                    || (broker.status == PeerStatus::Alive
                        && self.broker().seats.takes_new_work(node)
                        && !segment.facts.replicas.contains(&node)
                        && !segment.dropped.contains(&node))
            })
            .map(|broker| Candidate {
                broker_id: broker.record.node_id,
                attributes: broker.record.attributes,
            })
            .collect();
        let object = key.segment_id.to_le_bytes();
        let constraints = self.broker().coordination.placement_constraints(Some(key.topic_id));
        match placement::place(&object, wanted, &live, survivors, &constraints) {
            Ok(placed) => placed.brokers.into_iter().find(|broker| !survivors.contains(broker)),
            Err(error) => {
                tracing::debug!(?key, %error, "no placement for a new replica");
                None
            }
        }
    }

    /// Starts moving `segment`'s replica off `dead` to a live broker holding none, chosen by
    /// placement with the surviving replicas kept (so the constraints hold for the whole set).
    /// The dead replica stays in the set until the new copy is settled.
    async fn replace_replica(&self, term: u64, segment: &Unsettled, dead: u64) {
        let key = segment.key;
        let survivors: Vec<u64> = segment.facts.staying().filter(|&r| r != dead).collect();
        let wanted = segment.facts.staying().count();
        let Some(new) = self.new_replica_placed(segment, &survivors, wanted) else {
            tracing::debug!(?key, dead, "no live broker to move a replica to");
            return;
        };
        let command = MetaCommand::ReplaceReplica { segment_id: key.segment_id, old: dead, new };
        match self.broker().coordination.propose_in_term(term, key.topic_id, command).await {
            Ok(_) => tracing::info!(?key, dead, new, "replica moved off a dead broker"),
            Err(error) => tracing::warn!(?key, dead, new, %error, "moving a replica failed"),
        }
    }

    /// Asks `replica` to settle its copy of `key` (here if it is this broker).
    async fn settle_copy(
        &self,
        replica: u64,
        key: SegmentKey,
        seal: SealInfo,
        sources: &[u64],
    ) -> Result<bool, LogError> {
        let sources: Vec<u64> = sources.iter().copied().filter(|&s| s != replica).collect();
        if replica == self.node_id {
            return self.settle_here(key, seal, &sources).await;
        }
        let sources = sources.into_iter().take(peer::SETTLE_SOURCES_MAX).collect();
        let call = DataCall::Settle { seal, sources };
        let answer = self.data_call_within(replica, key, call, SETTLE_TIMEOUT_MS).await?;
        let settled = peer::decode_answer(&answer, |body| {
            let mut reader = Reader(body);
            let settled = reader.u8()?;
            reader.end().map(|()| settled != 0)
        })?;
        match settled {
            Remote::Done(settled) => Ok(settled),
            Remote::FencedOrGone => Err(LogError::NoSuchTopic),
        }
    }

    /// Answers a settle of this broker's copy.
    pub(crate) async fn answer_settle(
        &self,
        key: SegmentKey,
        asked: SealInfo,
        sources: Vec<u64>,
    ) -> Result<Vec<u8>, String> {
        // The seal point and the sources are this broker's metadata's, never the caller's: a
        // caller's word alone must not make a copy of acknowledged records shorter, or rebuild
        // it from a broker that holds no copy.
        let Some((seal, replicas)) = recorded_seal(self, key) else {
            return Ok(peer::encode_failure(&LogError::NoSuchTopic));
        };
        if seal != asked {
            return Err(format!(
                "the caller settles segment {key:?} at {asked:?}, this broker's metadata seals \
                 it at {seal:?}"
            ));
        }
        let sources: Vec<u64> =
            sources.into_iter().filter(|source| replicas.contains(source)).collect();
        let settled = self.settle_here(key, seal, &sources).await;
        Ok(peer::answer_of(settled.map(Some), |settled, answer| answer.push(u8::from(settled))))
    }

    /// Settles this broker's copy of sealed segment `key`: `true` once it is sealed at `seal`
    /// and intact, checked or rebuilt from one of `sources`; `false` when it is not and no
    /// source could give its records.
    pub(crate) async fn settle_here(
        &self,
        key: SegmentKey,
        seal: SealInfo,
        sources: &[u64],
    ) -> Result<bool, LogError> {
        if !matches!(self.listed(key), Some(Listed::Sealed { .. })) {
            return Err(LogError::NoSuchTopic);
        }
        let gate = self.broker().replicator.fill_gate(key);
        let _settling = gate.lock().await;
        if self.copy_is_settled(key, seal).await {
            return Ok(true);
        }
        match self.rebuild_copy(key, seal, sources).await {
            Ok(()) => Ok(true),
            Err(error) => {
                tracing::warn!(?key, ?sources, %error, "rebuilding a copy failed");
                Ok(false)
            }
        }
    }

    /// Whether this broker's copy of `key` is sealed at `seal` and every frame of it verifies.
    pub(crate) async fn copy_is_settled(&self, key: SegmentKey, seal: SealInfo) -> bool {
        let Ok(segment) = self.segment(key).await else { return false };
        let status = segment.status();
        if status.sealed != Some(seal) || status.damage.is_some() || status.poisoned.is_some() {
            return false;
        }
        match self.data.verify(key).await {
            Ok(report) => {
                report.bad_frames.is_empty()
                    && report.records == seal.end_offset
                    && report.sealed == Some(seal)
            }
            Err(_) => false,
        }
    }

    /// Writes this broker's copy of `key` afresh from the records of the `sources`' copies and
    /// its own. Every record is gathered first, each batch from the first copy that gives it
    /// intact (checksummed frames), so one copy's damage is bridged by another's records; the
    /// local copy is deleted only once all of them are here, and the rebuilt copy must come
    /// out at the recorded length and bytes.
    async fn rebuild_copy(
        &self,
        key: SegmentKey,
        seal: SealInfo,
        sources: &[u64],
    ) -> Result<(), LogError> {
        if seal.data_bytes > REBUILD_BYTES_MAX {
            return Err(LogError::Unavailable(format!(
                "{key:?} holds {} bytes, more than a rebuild gathers ({REBUILD_BYTES_MAX})",
                seal.data_bytes
            )));
        }
        let records = self.gather_records(key, seal.end_offset, sources).await?;
        tracing::info!(?key, ?sources, end = seal.end_offset, "rebuilding a copy");
        self.data.remove(key).await?;
        let opened = self.data.open(key, || Some(Listed::ActiveUnborn)).await?;
        let segment = opened.segment;
        for batch in records {
            if let Err(error) =
                self.broker().replicator.write_durably(&segment, batch, Write::Append).await
            {
                return Err(self.abandon(key, &error.to_string()).await);
            }
        }
        let sealed = self.data.seal(std::sync::Arc::clone(&segment)).await;
        match sealed {
            Ok(info) if info == seal => Ok(()),
            Ok(info) => Err(self.abandon(key, &format!("rebuilt as {info:?}, not {seal:?}")).await),
            Err(error) => Err(self.abandon(key, &error.to_string()).await),
        }
    }

    /// Records `[0, end)` of `key`, in batches, each read from the first of `sources` (then
    /// this broker's own copy) that holds it intact.
    async fn gather_records(
        &self,
        key: SegmentKey,
        end: u64,
        sources: &[u64],
    ) -> Result<Vec<Vec<malachi_log::Record>>, LogError> {
        let copies: Vec<u64> = sources.iter().copied().chain([self.node_id]).collect();
        let mut batches = Vec::new();
        let mut next = 0;
        while next < end {
            let wanted = u32::try_from(end - next).unwrap_or(u32::MAX).min(REBUILD_RECORDS_MAX);
            let mut batch = Vec::new();
            for &copy in &copies {
                match self.broker().replicator.read_raw(copy, key, next, wanted).await {
                    Ok(records) if !records.is_empty() => {
                        batch = records;
                        break;
                    }
                    Ok(_) => {}
                    Err(error) => tracing::debug!(?key, copy, next, %error, "a copy cannot give"),
                }
            }
            if batch.is_empty() {
                return Err(LogError::Unavailable(format!(
                    "no copy of {key:?} gives its records from {next} (of {end})"
                )));
            }
            next += batch.len() as u64;
            batches.push(batch);
        }
        Ok(batches)
    }

    /// Drops a rebuild that went wrong (its copy is not settled, and the next pass starts over).
    async fn abandon(&self, key: SegmentKey, why: &str) -> LogError {
        self.data.forget(key);
        LogError::Storage {
            reason: Reason::StorageDamaged,
            detail: format!("rebuilding {key:?}: {why}"),
        }
    }

    /// One scrub pass, on every broker: re-verifies the next settled copies this broker holds
    /// and records the ones that fail as unsettled.
    pub(crate) async fn scrub_once(&self) {
        let scrub = self.config.cluster.scrub;
        let now_ms = self.clock.now_ms();
        {
            let mut last = self.last_scrub_ms.lock().expect("scrub lock poisoned");
            if !scrub.enabled || now_ms < *last + scrub.interval_ms {
                return;
            }
            *last = now_ms;
        }
        let mine: Vec<(SegmentKey, SealInfo)> = self.read_every_meta(|meta| {
            meta.topics()
                .flat_map(|topic| topic.ranges.values().flat_map(|range| range.segment_ids.iter()))
                .filter_map(|&segment_id| {
                    let segment = meta.segment(segment_id)?;
                    let (end_offset, data_bytes) = segment.sealed_length()?;
                    segment.settled_on.contains(&self.node_id).then_some((
                        SegmentKey {
                            topic_id: segment.topic_id,
                            range_id: segment.range_id,
                            segment_id,
                        },
                        SealInfo { end_offset, data_bytes },
                    ))
                })
                .collect()
        });
        let after = *self.scrub_cursor.lock().expect("scrub lock poisoned");
        let mut next: Vec<(SegmentKey, SealInfo)> =
            mine.iter().filter(|(key, _)| key.segment_id > after).copied().collect();
        next.sort_by_key(|(key, _)| key.segment_id);
        if next.is_empty() {
            next = mine;
            next.sort_by_key(|(key, _)| key.segment_id);
        }
        for (key, seal) in next.into_iter().take(scrub.segments_per_tick as usize) {
            *self.scrub_cursor.lock().expect("scrub lock poisoned") = key.segment_id;
            if self.copy_is_settled(key, seal).await {
                continue;
            }
            tracing::warn!(?key, "the scrub found a damaged copy: it leaves the read path");
            self.unsettle_here(key).await;
        }
    }

    /// Records that this broker's copy of `key` is not settled any more (damaged): readers
    /// pass over it and the healer rebuilds it.
    pub(crate) async fn unsettle_here(&self, key: SegmentKey) {
        self.data.forget(key);
        let command = MetaCommand::CopiesSettled {
            segment_id: key.segment_id,
            nodes: vec![self.node_id],
            settled: false,
        };
        if let Err(error) = self.propose_meta(key.segment_id, command).await {
            tracing::warn!(?key, %error, "recording a damaged copy failed");
        }
    }
}

/// Where `broker`'s metadata seals segment `key`, and its replicas; `None` while it is active
/// there.
fn recorded_seal(broker: &Core, key: SegmentKey) -> Option<(SealInfo, Vec<u64>)> {
    broker.read_meta(key.segment_id, |meta| {
        let segment = meta.segment(key.segment_id)?;
        if (segment.topic_id, segment.range_id) != (key.topic_id, key.range_id) {
            return None;
        }
        let (end_offset, data_bytes) = segment.sealed_length()?;
        Some((SealInfo { end_offset, data_bytes }, segment.replicas.clone()))
    })
}
