//! What an operator sees of a topic's replication (`describe_segments`, key 72): each segment
//! with its replica set, the length metadata recorded when it was sealed, which copies metadata
//! records as settled, and what the broker holding each copy reports of it.
//!
//! The segments come from this broker's metadata; each copy is asked of its own broker (the
//! data call `DataCall::CopyState`, which answers the copy's durable end u64 and whether it is
//! sealed u8, or "gone" when there is nothing to report), or of this broker's data plane for
//! its own copies. Describing is read-only: it never fences, seals, creates or opens a head. A copy that is open (or closed
//! cleanly) is answered from memory; a sealed copy that is not is opened read-only, which a
//! sealed file takes without change; an active copy that is not open is not opened at all,
//! since opening recovers it (recovery may cut a torn tail, and a head an earlier process was
//! the primary of then waits for failover). Such a copy, and one whose broker is down or slow,
//! is reported as not answered.
//!
//! The queries run concurrently, a bounded number at once, each within a short timeout; a
//! broker that fails to answer one is not asked about its other copies, so a dead broker costs
//! one timeout, not one per segment.

use std::collections::BTreeSet;
use std::sync::Mutex;

use futures_util::stream::{self, StreamExt};
use malachi_log::SealInfo;
use malachi_meta::{MetaState, Segment};

use crate::data::{DataError, Listed, SegmentKey};
use crate::error::LogError;
use crate::gossip::PeerStatus;
use crate::peer::{self, DataCall, Reader, Remote};
use crate::scrape::Observer;

/// Segments one description lists at most: the first ones, in range then segment order.
pub const DESCRIBED_SEGMENTS_MAX: usize = 10_000;

/// How long a copy's broker has to answer: an operator waits for it once per silent broker.
const COPY_STATE_TIMEOUT_MS: u64 = 1_000;

/// Copy queries in flight at once, so a big topic does not flood the transport.
const COPY_QUERIES_IN_FLIGHT_MAX: usize = 64;

/// One segment as `describe_segments` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentDescription {
    pub range_id: u32,
    pub segment_id: u64,
    /// Records of the range before this segment's offset 0.
    pub base_records: u64,
    /// The length and bytes metadata recorded when it was sealed; `None` while active.
    pub seal: Option<SealInfo>,
    /// In replica order, the primary first.
    pub copies: Vec<CopyDescription>,
}

/// One replica's copy of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyDescription {
    pub node_id: u64,
    /// Metadata records this copy as settled (sealed at the recorded length and bytes, intact
    /// when last checked).
    pub settled: bool,
    /// What its broker reports; `None` when it did not answer, or has the copy neither open nor
    /// sealed on its disk.
    pub state: Option<CopyState>,
}

/// A copy as the broker holding it reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyState {
    /// Records durable in this copy.
    pub durable_offset: u64,
    /// The copy itself is sealed.
    pub sealed: bool,
}

/// Nodes that failed to answer during one description: not asked again in it.
type Silent = Mutex<BTreeSet<u64>>;

impl Observer {
    /// Each segment of `topic` (the first [`DESCRIBED_SEGMENTS_MAX`]) with its copies, each as
    /// its broker reports it.
    pub async fn describe_segments(
        &self,
        topic: &str,
    ) -> Result<Vec<SegmentDescription>, LogError> {
        self.broker().see_topic(topic).await?;
        let (topic_id, mut segments) = self.read_meta_named(topic, |meta| {
            listed_segments(meta, topic, DESCRIBED_SEGMENTS_MAX).ok_or(LogError::NoSuchTopic)
        })?;
        let queries: Vec<(usize, usize, u64, SegmentKey)> = segments
            .iter()
            .enumerate()
            .flat_map(|(at, segment)| {
                let key = SegmentKey {
                    topic_id,
                    range_id: segment.range_id,
                    segment_id: segment.segment_id,
                };
                segment.copies.iter().enumerate().map(move |(copy, c)| (at, copy, c.node_id, key))
            })
            .collect();
        let silent = Silent::default();
        let answers: Vec<(usize, usize, Option<CopyState>)> = stream::iter(queries)
            .map(|(at, copy, node, key)| {
                let silent = &silent;
                async move { (at, copy, self.copy_state_of(node, key, silent).await) }
            })
            .buffer_unordered(COPY_QUERIES_IN_FLIGHT_MAX)
            .collect()
            .await;
        for (at, copy, state) in answers {
            segments[at].copies[copy].state = state;
        }
        Ok(segments)
    }

    /// What `node` reports of its copy of `key`; `None` when it does not answer (or is known
    /// to be down, or failed to answer earlier in this description).
    async fn copy_state_of(
        &self,
        node: u64,
        key: SegmentKey,
        silent: &Silent,
    ) -> Option<CopyState> {
        let outcome = if node == self.node_id {
            self.copy_state_here(key).await
        } else {
            let skipped = silent.lock().expect("silent lock poisoned").contains(&node);
            if skipped || self.member_status(node) == PeerStatus::Dead {
                return None;
            }
            match self.data_call_within(node, key, DataCall::CopyState, COPY_STATE_TIMEOUT_MS).await
            {
                Ok(answer) => decode_copy_state(&answer),
                Err(error) => {
                    silent.lock().expect("silent lock poisoned").insert(node);
                    Err(error)
                }
            }
        };
        outcome.unwrap_or_else(|error| {
            tracing::debug!(?key, node, %error, "a copy's state is unknown");
            None
        })
    }

    /// This broker's copy of `key` as it stands, changing nothing (see the module header);
    /// `None` when it is an active copy not open here, or metadata no longer lists it.
    pub(crate) async fn copy_state_here(
        &self,
        key: SegmentKey,
    ) -> Result<Option<CopyState>, LogError> {
        if let Some(held) = self.data.durable_state(key) {
            return Ok(Some(CopyState {
                durable_offset: held.durable_offset,
                sealed: held.sealed,
            }));
        }
        // Only a sealed segment's file is opened here: that open is read-only and never creates
        // a file (a missing one is damage).
        if !matches!(self.listed(key), Some(Listed::Sealed { .. })) {
            return Ok(None);
        }
        match self.segment(key).await {
            Ok(segment) => {
                let status = segment.status();
                let sealed = status.sealed.is_some();
                Ok(Some(CopyState { durable_offset: status.durable_offset, sealed }))
            }
            Err(DataError::Gone(_)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Answers a request for this broker's copy's state.
    pub(crate) async fn answer_copy_state(&self, key: SegmentKey) -> Vec<u8> {
        match self.copy_state_here(key).await {
            Ok(Some(state)) => encode_copy_state(state),
            outcome => peer::answer_of(outcome, |_, _| {}),
        }
    }
}

/// The first `max` segments of topic `name`, in range then segment order, with their copies
/// as metadata lists them (states not asked yet), and the topic's id; `None` without the
/// topic.
fn listed_segments(
    meta: &MetaState,
    name: &str,
    max: usize,
) -> Option<(u64, Vec<SegmentDescription>)> {
    let topic = meta.topic_by_name(name)?;
    let segments = topic
        .ranges
        .keys()
        .flat_map(|&range_id| meta.range_segments(topic.topic_id, range_id))
        .take(max)
        .map(describe_listed)
        .collect();
    Some((topic.topic_id, segments))
}

fn describe_listed(segment: &Segment) -> SegmentDescription {
    let copies = segment
        .replicas
        .iter()
        .map(|&node_id| CopyDescription {
            node_id,
            settled: segment.settled_on.contains(&node_id),
            state: None,
        })
        .collect();
    SegmentDescription {
        range_id: segment.range_id,
        segment_id: segment.segment_id,
        base_records: segment.range_base_records,
        seal: segment
            .sealed_length()
            .map(|(end_offset, data_bytes)| SealInfo { end_offset, data_bytes }),
        copies,
    }
}

fn encode_copy_state(state: CopyState) -> Vec<u8> {
    peer::answer_of(Ok(Some(state)), |state, answer| {
        answer.extend_from_slice(&state.durable_offset.to_le_bytes());
        answer.push(u8::from(state.sealed));
    })
}

/// A copy-state answer: the copy's state, `None` when its broker has none to report.
fn decode_copy_state(answer: &[u8]) -> Result<Option<CopyState>, LogError> {
    let decoded = peer::decode_answer(answer, |body| {
        let mut reader = Reader(body);
        let durable_offset = reader.u64()?;
        let sealed = match reader.u8()? {
            0 => false,
            1 => true,
            flag => return Err(format!("sealed flag {flag}")),
        };
        if !reader.0.is_empty() {
            return Err(format!("{} bytes after a copy state", reader.0.len()));
        }
        Ok(CopyState { durable_offset, sealed })
    })?;
    Ok(match decoded {
        Remote::Done(state) => Some(state),
        Remote::FencedOrGone => None,
    })
}

#[cfg(test)]
mod tests;
