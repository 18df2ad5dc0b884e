//! Sealing a replicated segment: by its primary when it can, by failover when it cannot.
//!
//! **Seal by the primary** (a roll, split, merge or delete while the primary lives): the
//! primary seals its own copy, which stops its appends and ends the segment where its staged
//! records end (E); it waits until a quorum of the replicas holds E durably, then seals the
//! followers' copies at E. Nothing of E is then short of a quorum.
//!
//! **Failover** (the primary is dead, cannot reach a quorum, restarted, or its seal failed)
//! never promotes a follower (design.md, invariant 4). With `n` replicas and the
//! acknowledgement quorum `q`, it needs `n - q + 1` of them: any acknowledged record is on `q`
//! replicas, so some replica among any `n - q + 1` holds it, and the highest durable end among
//! them covers every acknowledged record. In this order:
//!
//! 1. *measure*: ask every replica where its copy ends, read-only (a broker membership calls
//!    dead is asked too: one that answers is alive). Fewer than `n - q + 1` answers: nothing
//!    is touched and the range refuses writes until more answer (a fence cannot be undone, and
//!    fencing copies of a segment that is then not sealed would shrink every later quorum).
//! 2. *fence* the answering copies: each refuses its primary's appends from then on, also
//!    after a restart (a durable marker), and reports its durable end. A primary still alive
//!    finds no quorum: every follower it reaches refuses it.
//! 3. the seal point L is the highest fenced end, or, when an earlier seal already sealed
//!    some copies, the end they were sealed at (see [`seal_point`]); copies short of L are
//!    *filled* from one at L (fills pass the fence), then every copy at L is *sealed* there,
//!    and only then is L returned for metadata to record. Every sealed copy holds the same
//!    records at the same offsets, encoded the same way, with the same trailer (each frame's
//!    batch-start mark and its checksum aside: they mark the copy's own writes).
//!
//! A copy that could not be filled or sealed, or that did not answer, is left for healing to
//! settle or replace.

use malachi_log::canary;
use malachi_reason::Reason;
use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
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

/// Where one replica's copy ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyEnd {
    pub(crate) node_id: u64,
    pub(crate) end_offset: u64,
    pub(crate) data_bytes: u64,
    /// The copy is sealed (at `end_offset`).
    pub(crate) sealed: bool,
}

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
        let sealed = self.seal_copies_at(key, &replicas, info.end_offset).await;
        let wanted = quorum(replicas.len());
        if sealed.len() < wanted {
            return Err(LogError::NoQuorum(format!(
                "{key:?}: {} of {} copies sealed at {}",
                sealed.len(),
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
        let needed = match canary(self.canaries.seal_without_enough_answers) {
            true => 1,
            false => replicas.len() - quorum(replicas.len()) + 1,
        };
        let enough = |what: &str, count: usize| {
            if count >= needed {
                Ok(())
            } else {
                Err(LogError::NoQuorum(format!(
                    "{key:?}: {count} of {} replicas {what}, {needed} needed to seal it",
                    replicas.len()
                )))
            }
        };
        let alive = self.probe_copies(key, &replicas).await;
        enough("answer", alive.len())?;
        let fenced = self.fence_copies(key, &alive).await;
        enough("are fenced", fenced.len())?;
        let seal_end = match canary(self.canaries.promote_follower) {
            true => promoted_end(&fenced, replicas[0]),
            false => seal_point(&fenced),
        };
        let source = fenced
            .iter()
            .filter(|copy| copy.end_offset == seal_end)
            .map(|copy| copy.node_id)
            .min_by_key(|&node| (node != self.node_id, node))
            .expect("some copy ends at the highest end");
        let fills = fenced.iter().filter(|copy| copy.end_offset < seal_end && !copy.sealed).map(
            |copy| async move {
                let filled = self.fill_copy(copy.node_id, key, source, seal_end).await;
                if let Err(error) = &filled {
                    tracing::warn!(?key, copy = copy.node_id, %error, "filling a copy failed");
                }
                filled.ok().filter(|&end| end == seal_end).map(|_| copy.node_id)
            },
        );
        let mut at_end: Vec<u64> = join_all(fills).await.into_iter().flatten().collect();
        at_end.extend(fenced.iter().filter(|copy| copy.end_offset == seal_end).map(|c| c.node_id));
        let sealed = self.seal_copies_at(key, &at_end, seal_end).await;
        // The promote canary's follower becomes the segment alone, as a promoting design's would.
        let promoted = canary(self.canaries.promote_follower) && !sealed.is_empty();
        if !promoted {
            enough("are sealed at the highest end", sealed.len())?;
        }
        let data_bytes = sealed[0].data_bytes;
        assert!(
            sealed.iter().all(|copy| copy.data_bytes == data_bytes),
            "copies sealed at one record count hold the same bytes: {sealed:?}"
        );
        tracing::info!(?key, seal_end, copies = ?sealed.iter().map(|c| c.node_id).collect::<Vec<_>>(),
            "sealed by failover");
        self.replication.forget(key);
        Ok(SealReport { segment_id: key.segment_id, end_offset: seal_end, data_bytes })
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

    /// Seals the copies on `nodes` at `end_offset`; those that are sealed there now.
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
                    None
                }
                Err(error) => {
                    tracing::warn!(?key, node, %error, end, "sealing a copy failed");
                    None
                }
            }
        });
        join_all(seals).await.into_iter().flatten().collect()
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

/// Where a failover seals, given the fenced copies (at least one). Copies an earlier seal
/// already sealed decide it when there are any: each was sealed at or past every acknowledged
/// record (a primary drains at its staged end, a failover at the highest end of `n - q + 1`
/// fenced copies), and a sealed copy can be neither filled nor cut, so a seal point elsewhere
/// could never gather them (a failover whose seal metadata did not record, then a restarted
/// primary with unacknowledged records past it, would leave the range unsealable). The end most
/// sealed copies share wins, the higher on a tie. Without sealed copies: the highest fenced end,
/// which covers every acknowledged record.
fn seal_point(fenced: &[CopyEnd]) -> u64 {
    let mut sealed_at: BTreeMap<u64, usize> = BTreeMap::new();
    for copy in fenced.iter().filter(|copy| copy.sealed) {
        *sealed_at.entry(copy.end_offset).or_default() += 1;
    }
    let agreed = sealed_at.into_iter().max_by_key(|&(end, copies)| (copies, end));
    match agreed {
        Some((end, _)) => end,
        None => fenced.iter().map(|copy| copy.end_offset).max().expect("some copy answered"),
    }
}

/// The promote-follower canary's end: the copy of the follower furthest behind, as an unlucky
/// election would promote it (the primary's own copy when no follower answered).
fn promoted_end(fenced: &[CopyEnd], primary: u64) -> u64 {
    let followers = fenced.iter().filter(|copy| copy.node_id != primary);
    let lowest = followers.map(|copy| copy.end_offset).min();
    lowest.unwrap_or_else(|| fenced.iter().map(|copy| copy.end_offset).max().unwrap_or(0))
}

/// How [`Broker::write_durably`] writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Write {
    /// An append, to a copy that takes them (being rebuilt).
    Append,
    /// A fill, to a fenced copy.
    Fill,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(node_id: u64, end_offset: u64, sealed: bool) -> CopyEnd {
        CopyEnd { node_id, end_offset, data_bytes: end_offset * 10, sealed }
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
            let fenced: Vec<CopyEnd> = ends
                .iter()
                .enumerate()
                .map(|(at, &(end, sealed))| copy(at as u64 + 1, end, sealed))
                .collect();
            assert_eq!(seal_point(&fenced), *expected, "{name}");
        }
    }
}
