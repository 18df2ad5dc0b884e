//! Sealing a replicated segment: by its primary when it can, by failover when it cannot.
//!
//! **Seal by the primary** (a roll, split, merge or delete while the primary lives): the
//! primary seals its own copy, which stops its appends and ends the segment where its staged
//! records end (E); it waits until a quorum of the replicas holds E durably, then seals the
//! followers' copies at E. Nothing of E is then short of a quorum.
//!
//! **Failover** (the primary is dead, cannot reach a quorum, restarted, or its seal failed)
//! never promotes a follower (design.md, invariant 4). Its decisions are the sans-IO machine
//! [`malachi_cluster::failover::Failover`] (how many copies are enough, the seal point, which
//! copies to fill and from where, which to seal); this is its driver, which probes, fences,
//! fills and seals the copies on their brokers. Fences are durable markers: a fenced copy
//! refuses its primary's appends, also after a restart, so a primary still alive finds no
//! quorum. Fills pass the fence. Every sealed copy holds the same records at the same offsets,
//! encoded the same way, with the same trailer (each frame's batch-start mark and its checksum
//! aside: they mark the copy's own writes).
//!
//! A copy that could not be filled or sealed, or that did not answer, is left for healing to
//! settle or replace.

use malachi_reason::Reason;
use std::time::Duration;

use futures_util::future::join_all;
use malachi_cluster::failover::{Failover, FailoverCanaries, TooFew};
use malachi_cluster::replication::quorum;
use malachi_log::Record;
use malachi_meta::SealReport;

use super::Replicator;
use crate::data::SegmentKey;
use crate::error::LogError;
use crate::peer::{self, DataCall, Reader, Remote, answer_of};

/// How long a replica may take to say where its copy ends, or to fence it.
const PROBE_TIMEOUT_MS: u64 = 2_000;
/// How long a broker a probe could not reach stays out of new replica sets: longer than
/// membership takes to call a dead broker dead, which then keeps it out.
const UNREACHABLE_HOLD_MS: u64 = 10_000;
const FENCE_TIMEOUT_MS: u64 = 5_000;
/// How long a fill may take (it copies up to a whole segment's tail).
const FILL_TIMEOUT_MS: u64 = 60_000;
/// Records copied per read of a fill.
const FILL_RECORDS_MAX: u32 = 4_096;
const FILL_BYTES_MAX: u64 = 4 << 20;

pub(crate) use malachi_cluster::failover::CopyEnd;

impl Replicator {
    /// Seals replicated segment `key` on this broker, its primary: by draining when this
    /// process created the head and a quorum follows, by failover otherwise.
    pub(crate) async fn seal_as_primary(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        if self.replication.head(key).is_some() {
            match self.seal_by_draining(key).await {
                Ok(seal) => return Ok(seal),
                Err(error) => {
                    tracing::warn!(?key, %error, "the primary could not seal with a quorum; \
                        sealing by failover");
                }
            }
        } else {
            tracing::info!(?key, "the primary has no replication state (restarted): failover");
        }
        self.seal_by_failover(key).await
    }

    /// The primary's own seal: its copy ends at E, a quorum holds E, the followers seal at E.
    async fn seal_by_draining(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        let head = self.replication.head(key).ok_or(LogError::Migrating)?;
        let segment = self.segment(key).await?;
        if head.copy_lost(&segment) {
            // Sealed here it would end short of records the followers hold.
            self.after_local_failure(&head);
            return Err(LogError::NoQuorum(format!("{key:?}: the primary's copy lost records")));
        }
        let info = self.data.seal(segment).await.map_err(|error| LogError::Storage {
            reason: Reason::Unfenced,
            detail: format!("sealing the primary's copy of {key:?} failed: {error}"),
        })?;
        let timeout = Duration::from_millis(self.config.cluster.replication_timeout_ms);
        let mut acked = head.subscribe();
        let reached = tokio::time::timeout(timeout, async {
            loop {
                let now = *acked.borrow_and_update();
                if now.end >= info.end_offset {
                    return true;
                }
                if now.refused_from.is_some_and(|from| from < info.end_offset) {
                    return false;
                }
                if acked.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await;
        if reached != Ok(true) {
            return Err(LogError::NoQuorum(format!(
                "{key:?} is sealed at {} on its primary, which a quorum does not hold",
                info.end_offset
            )));
        }
        let replicas = self.replicas(key).unwrap_or_default();
        let wanted = quorum(replicas.len());
        let sealed = self.seal_quorum_at(key, &replicas, info.end_offset, wanted).await;
        if sealed < wanted {
            return Err(LogError::NoQuorum(format!(
                "{key:?}: {sealed} of {} copies sealed at {}",
                replicas.len(),
                info.end_offset
            )));
        }
        self.replication.forget(key);
        Ok(SealReport {
            segment_id: key.segment_id,
            end_offset: info.end_offset,
            data_bytes: info.data_bytes,
        })
    }

    /// Seals replicated segment `key` by failover (the module's doc), from any broker.
    pub(crate) async fn seal_by_failover(&self, key: SegmentKey) -> Result<SealReport, LogError> {
        let replicas = self.replicas(key).ok_or(LogError::NoSuchTopic)?;
        let canaries = FailoverCanaries {
            seal_without_enough_answers: self.canaries.seal_without_enough_answers,
            promote_follower: self.canaries.promote_follower,
        };
        let mut failover = Failover::new(replicas, self.node_id, canaries);
        let too_few = |refusal: TooFew| LogError::NoQuorum(format!("{key:?}: {refusal}"));
        let alive = self.probe_copies(key, failover.replicas()).await;
        let to_fence = failover.probed(alive).map_err(too_few)?;
        let fenced = self.fence_copies(key, &to_fence).await;
        let fill = failover.fenced(fenced).map_err(too_few)?;
        let fills = fill.copies.iter().map(|&node| async move {
            let filled = self.fill_copy(node, key, fill.source, fill.end).await;
            if let Err(error) = &filled {
                tracing::warn!(?key, copy = node, %error, "filling a copy failed");
            }
            filled.ok().map(|end| (node, end))
        });
        let filled = join_all(fills).await.into_iter().flatten().collect();
        let seal_at = failover.filled(filled);
        let answers = self.seal_copies_at(key, &seal_at.copies, seal_at.end).await;
        let sealed = failover.sealed(answers).map_err(too_few)?;
        tracing::info!(?key, seal_end = sealed.end_offset, copies = ?sealed.copies,
            "sealed by failover");
        self.replication.forget(key);
        let (end_offset, data_bytes) = (sealed.end_offset, sealed.data_bytes);
        Ok(SealReport { segment_id: key.segment_id, end_offset, data_bytes })
    }

    /// Asks every replica where its copy ends, read-only; the ones that answered.
    async fn probe_copies(&self, key: SegmentKey, replicas: &[u64]) -> Vec<u64> {
        let probes = replicas.iter().map(|&node| async move {
            let answered = if node == self.node_id {
                // Its own copy's durable end, not what readers may see: a restarted
                // primary's copy counts although it refuses readers.
                self.active_durable_end(key).await.is_ok()
            } else {
                let answered =
                    self.data_call_within(node, key, DataCall::End, PROBE_TIMEOUT_MS).await.is_ok();
                self.saw_reachable(node, answered);
                answered
            };
            answered.then_some(node)
        });
        join_all(probes).await.into_iter().flatten().collect()
    }

    /// Records whether a probe reached `node`: one that did not is kept out of new replica sets
    /// for [`UNREACHABLE_HOLD_MS`] (membership takes longer to call a dead broker dead).
    fn saw_reachable(&self, node: u64, answered: bool) {
        let now_ms = self.clock.now_ms();
        let mut held = self.unreachable_until_ms.lock().expect("unreachable lock poisoned");
        held.retain(|_, until| *until > now_ms);
        if answered {
            held.remove(&node);
        } else {
            held.insert(node, now_ms + UNREACHABLE_HOLD_MS);
        }
    }

    /// Whether a failover's probe failed to reach `node` a moment ago.
    pub(crate) fn recently_unreachable(&self, node: u64) -> bool {
        let now_ms = self.clock.now_ms();
        let held = self.unreachable_until_ms.lock().expect("unreachable lock poisoned");
        held.get(&node).is_some_and(|until| *until > now_ms)
    }

    /// Fences the copies on `nodes`; where each that answered ends.
    async fn fence_copies(&self, key: SegmentKey, nodes: &[u64]) -> Vec<CopyEnd> {
        let fences = nodes.iter().map(|&node| async move {
            let fenced = if node == self.node_id {
                self.fence_here(key).await
            } else {
                match self.data_call_within(node, key, DataCall::Fence, FENCE_TIMEOUT_MS).await {
                    Ok(answer) => decode_copy_end(node, &answer),
                    Err(error) => Err(error),
                }
            };
            match fenced {
                Ok(end) => Some(end),
                Err(error) => {
                    tracing::warn!(?key, node, %error, "fencing a copy failed");
                    None
                }
            }
        });
        join_all(fences).await.into_iter().flatten().collect()
    }

    /// Seals the copies on `nodes` at `end_offset`; where each that answered ends.
    async fn seal_copies_at(&self, key: SegmentKey, nodes: &[u64], end: u64) -> Vec<CopyEnd> {
        let seals = nodes.iter().map(|&node| async move {
            let sealed = if node == self.node_id {
                self.seal_at_here(key, end).await
            } else {
                let call = DataCall::SealAt { end };
                match self.data_call_within(node, key, call, FENCE_TIMEOUT_MS).await {
                    Ok(answer) => decode_copy_end(node, &answer),
                    Err(error) => Err(error),
                }
            };
            match sealed {
                Ok(copy) if copy.sealed && copy.end_offset == end => Some(copy),
                Ok(copy) => {
                    tracing::warn!(?key, node, ?copy, end, "a copy did not seal at the end");
                    Some(copy)
                }
                Err(error) => {
                    tracing::warn!(?key, node, %error, end, "sealing a copy failed");
                    None
                }
            }
        });
        join_all(seals).await.into_iter().flatten().collect()
    }

    /// Seals the copies on `nodes` at `end` until `wanted` of them did; how many did. A copy
    /// whose broker is gone (a follower stopped, its host silent until the connect times out)
    /// is not waited for once a quorum sealed: it is settled at the seal by healing, and a roll
    /// does not stall producers for a connect timeout meanwhile.
    async fn seal_quorum_at(
        &self,
        key: SegmentKey,
        nodes: &[u64],
        end: u64,
        wanted: usize,
    ) -> usize {
        use futures_util::StreamExt;
        let mut seals: futures_util::stream::FuturesUnordered<_> = nodes
            .iter()
            .map(|&node| async move { self.seal_copies_at(key, &[node], end).await })
            .collect();
        let mut sealed = 0;
        while sealed < wanted {
            let Some(copies) = seals.next().await else { break };
            // Counted as `seal_copies_at` answers them (a copy that answered off the end is
            // logged there and counted, as before).
            sealed += copies.len();
        }
        sealed
    }

    /// Has the copy on `node` filled up to `end` from the copy on `source`; where it ends.
    async fn fill_copy(
        &self,
        node: u64,
        key: SegmentKey,
        source: u64,
        end: u64,
    ) -> Result<u64, LogError> {
        if node == self.node_id {
            return self.fill_here(key, source, end).await;
        }
        let call = DataCall::Fill { source, end };
        let answer = self.data_call_within(node, key, call, FILL_TIMEOUT_MS).await?;
        decode_copy_end(node, &answer).map(|copy| copy.end_offset)
    }

    /// Fences this broker's copy of `key` (a sealed copy stays as it is).
    pub(crate) async fn fence_here(&self, key: SegmentKey) -> Result<CopyEnd, LogError> {
        let segment = self.segment(key).await?;
        let status = segment.status();
        if let Some(seal) = status.sealed {
            return Ok(CopyEnd {
                node_id: self.node_id,
                end_offset: seal.end_offset,
                data_bytes: seal.data_bytes,
                sealed: true,
            });
        }
        let fencing = std::sync::Arc::clone(&segment);
        let status = self
            .data
            .run(move || fencing.fence())
            .await
            .map_err(|error| LogError::from(crate::data::DataError::Append(error)))?;
        Ok(CopyEnd {
            node_id: self.node_id,
            end_offset: status.durable_offset,
            data_bytes: status.durable_bytes,
            sealed: false,
        })
    }

    /// Copies the records this broker's copy of `key` lacks below `end` from `source`'s copy.
    pub(crate) async fn fill_here(
        &self,
        key: SegmentKey,
        source: u64,
        end: u64,
    ) -> Result<u64, LogError> {
        let segment = self.segment(key).await?;
        let gate = self.replication.fill_gate(key);
        let _filling = gate.lock().await;
        loop {
            let from = segment.staged_end();
            if from >= end {
                break;
            }
            let wanted = u32::try_from(end - from).unwrap_or(u32::MAX).min(FILL_RECORDS_MAX);
            let records = self.read_raw(source, key, from, wanted).await?;
            if records.is_empty() {
                return Err(LogError::Unavailable(format!(
                    "broker {source} holds no records of {key:?} from {from}"
                )));
            }
            self.write_durably(&segment, records, Write::Fill).await?;
        }
        Ok(segment.durable_offset())
    }

    /// Writes `records` at the end of `segment` and waits until they are durable: appended to
    /// a copy being rebuilt, or filled into a fenced one.
    pub(crate) async fn write_durably(
        &self,
        segment: &std::sync::Arc<malachi_log::Segment>,
        records: Vec<Record>,
        how: Write,
    ) -> Result<(), LogError> {
        let writing = std::sync::Arc::clone(segment);
        self.data
            .run(move || {
                let ticket = match how {
                    Write::Append => writing.stage(&records)?,
                    Write::Fill => writing.stage_fill(&records)?,
                };
                writing.wait_durable(ticket)
            })
            .await
            .map_err(|error| LogError::from(crate::data::DataError::Append(error)))
    }

    /// Reads durable records `[from, from + wanted)` of `source`'s copy of `key`.
    pub(crate) async fn read_raw(
        &self,
        source: u64,
        key: SegmentKey,
        from: u64,
        wanted: u32,
    ) -> Result<Vec<Record>, LogError> {
        if source == self.node_id {
            let segment = self.segment(key).await?;
            let batch = self.data.read(segment, from, wanted, FILL_BYTES_MAX).await;
            let batch =
                batch.map_err(|error| LogError::from(crate::data::DataError::from(error)))?;
            return Ok(batch.records.into_iter().map(|stored| stored.record).collect());
        }
        let call = DataCall::ReadRaw { from, wanted, bytes_max: FILL_BYTES_MAX };
        let answer = self.data_call_within(source, key, call, FILL_TIMEOUT_MS).await?;
        match peer::decode_answer(&answer, |body| peer::decode_records(&mut Reader(body)))? {
            Remote::Done(records) => Ok(records),
            Remote::FencedOrGone => Err(LogError::NoSuchTopic),
        }
    }

    /// Seals this broker's copy of `key` at `end` if it holds exactly that many records.
    pub(crate) async fn seal_at_here(
        &self,
        key: SegmentKey,
        end: u64,
    ) -> Result<CopyEnd, LogError> {
        let segment = self.segment(key).await?;
        let sealed = |seal: malachi_log::SealInfo| CopyEnd {
            node_id: self.node_id,
            end_offset: seal.end_offset,
            data_bytes: seal.data_bytes,
            sealed: true,
        };
        if let Some(seal) = segment.status().sealed {
            return Ok(sealed(seal));
        }
        if segment.staged_end() != end {
            let status = segment.status();
            return Ok(CopyEnd {
                node_id: self.node_id,
                end_offset: status.durable_offset,
                data_bytes: status.durable_bytes,
                sealed: false,
            });
        }
        let seal = self.data.seal(segment).await.map_err(|error| LogError::Storage {
            reason: Reason::Unfenced,
            detail: format!("sealing a copy of {key:?} failed: {error}"),
        })?;
        Ok(sealed(seal))
    }

    /// Answers a failover's fence of this broker's copy.
    pub(crate) async fn answer_fence(&self, key: SegmentKey) -> Vec<u8> {
        encode_copy_end(self.fence_here(key).await)
    }

    /// Answers a failover's fill of this broker's copy from the copy on `source`, which must
    /// be one this broker's metadata lists (never a caller's word alone).
    pub(crate) async fn answer_fill(
        &self,
        key: SegmentKey,
        source: u64,
        end: u64,
    ) -> Result<Vec<u8>, String> {
        if !self.read_meta(key.segment_id, |meta| {
            meta.segment(key.segment_id).is_some_and(|segment| segment.replicas.contains(&source))
        }) {
            return Err(format!("broker {source} holds no copy of segment {key:?}"));
        }
        let filled = self.fill_here(key, source, end).await;
        Ok(encode_copy_end(filled.and_then(|_| self.copy_end_here(key))))
    }

    /// Answers a failover's seal of this broker's copy at `end`.
    pub(crate) async fn answer_seal_at(&self, key: SegmentKey, end: u64) -> Vec<u8> {
        encode_copy_end(self.seal_at_here(key, end).await)
    }

    /// Answers a read of this broker's copy as stored (at most [`FILL_RECORDS_MAX`] records,
    /// [`FILL_BYTES_MAX`] bytes, whatever the caller asked).
    pub(crate) async fn answer_read_raw(&self, key: SegmentKey, from: u64, wanted: u32) -> Vec<u8> {
        let read = self.read_raw(self.node_id, key, from, wanted.min(FILL_RECORDS_MAX)).await;
        answer_of(read.map(Some), |records, answer| peer::encode_records(&records, answer))
    }

    fn copy_end_here(&self, key: SegmentKey) -> Result<CopyEnd, LogError> {
        let segment = self.data.peek(key).ok_or(LogError::Migrating)?;
        let status = segment.status();
        Ok(CopyEnd {
            node_id: self.node_id,
            end_offset: status.durable_offset,
            data_bytes: status.durable_bytes,
            sealed: status.sealed.is_some(),
        })
    }
}

fn encode_copy_end(copy: Result<CopyEnd, LogError>) -> Vec<u8> {
    answer_of(copy.map(Some), |copy, answer| {
        answer.extend_from_slice(&copy.end_offset.to_le_bytes());
        answer.extend_from_slice(&copy.data_bytes.to_le_bytes());
        answer.push(u8::from(copy.sealed));
    })
}

fn decode_copy_end(node_id: u64, answer: &[u8]) -> Result<CopyEnd, LogError> {
    let decoded = peer::decode_answer(answer, |body| {
        let mut reader = Reader(body);
        let (end_offset, data_bytes, sealed) = (reader.u64()?, reader.u64()?, reader.u8()?);
        reader.end()?;
        Ok(CopyEnd { node_id, end_offset, data_bytes, sealed: sealed != 0 })
    })?;
    match decoded {
        Remote::Done(copy) => Ok(copy),
        Remote::FencedOrGone => Err(LogError::NoSuchTopic),
    }
}

/// How [`Broker::write_durably`] writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Write {
    /// An append, to a copy that takes them (being rebuilt).
    Append,
    /// A fill, to a fenced copy.
    Fill,
}
