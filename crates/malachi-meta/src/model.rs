//! The records the metadata machine keeps: topics, ranges, segments, consumer groups, and the
//! segments waiting for the data plane to delete their files. Does no I/O.
//!
//! These types are read-only views for callers: [`crate::MetaState`] hands out `&` references
//! and changes them only inside `apply`, so the invariants in `invariants.rs` hold at every
//! metadata version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::membership::Membership;

use crate::keyspace::Extent;

/// Per-topic segment roll thresholds; `None` falls back to [`SegmentRollDefaults`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRoll {
    pub max_bytes: Option<u64>,
    pub max_age_ms: Option<u64>,
}

/// Cluster-wide roll thresholds (`MALACHI_SEGMENT_MAX_BYTES`, `MALACHI_SEGMENT_MAX_AGE_MS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRollDefaults {
    pub max_bytes: u64,
    pub max_age_ms: u64,
}

impl Default for SegmentRollDefaults {
    fn default() -> SegmentRollDefaults {
        SegmentRollDefaults { max_bytes: 67_108_864, max_age_ms: 604_800_000 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub topic_id: u64,
    pub name: String,
    pub created_ms: u64,
    pub segment_roll: SegmentRoll,
    /// The storage policy name this topic is bound to; it may name no definition (unresolved).
    pub policy: Option<String>,
    /// The principal that created the topic (`None`: an administrator), for per-user quotas.
    #[serde(default)]
    pub created_by: Option<String>,
    /// Next `range_id` to hand out; range ids are never reused within a topic.
    pub next_range_id: u32,
    /// Every range the topic ever had, active and sealed: readers need sealed ancestors to
    /// drain a parent's slice before a child's records.
    pub ranges: BTreeMap<u32, Range>,
    /// Active ranges by extent start: the routing index, derived from `ranges` and asserted
    /// equal to it after every change.
    pub active_by_start: BTreeMap<u64, u32>,
    pub groups: BTreeMap<String, ConsumerGroup>,
}

impl Topic {
    /// The active range that owns `point`. Always `Some` because active ranges tile the keyspace.
    pub fn route(&self, point: u64) -> &Range {
        let (_, range_id) = self
            .active_by_start
            .range(..=point)
            .next_back()
            .expect("active ranges tile the keyspace, so one starts at or below any point");
        let range = &self.ranges[range_id];
        assert!(range.extent.contains(point) && range.is_active());
        range
    }

    /// Active ranges in keyspace order.
    pub fn active_ranges(&self) -> impl Iterator<Item = &Range> {
        self.active_by_start.values().map(|range_id| &self.ranges[range_id])
    }

    pub fn active_range_count(&self) -> u32 {
        u32::try_from(self.active_by_start.len()).expect("active ranges are bounded by limits")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RangeState {
    Active,
    /// Sealed by a split or merge; its segments stay readable until retention removes them.
    Sealed {
        sealed_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub range_id: u32,
    pub extent: Extent,
    /// None for an initial range, one for a split child, two (low, high) for a merge result.
    pub parents: Vec<u32>,
    /// The ranges that replaced this one: two (low, high) after a split, one after a merge.
    pub children: Vec<u32>,
    pub state: RangeState,
    pub created_ms: u64,
    /// Retained segments, oldest first; the last one is the active one iff the range is active.
    pub segment_ids: Vec<u64>,
    /// Records removed from the front of this range by retention. Equals the first retained
    /// segment's `range_base_records`, so a reader can tell how many records a cursor skipped.
    pub expired_records: u64,
}

impl Range {
    pub fn is_active(&self) -> bool {
        self.state == RangeState::Active
    }

    /// The segment taking appends; `None` for a sealed range.
    pub fn active_segment_id(&self) -> Option<u64> {
        if self.is_active() { self.segment_ids.last().copied() } else { None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentState {
    Active,
    /// Immutable once set: `end_offset` is the record count, `data_bytes` what the store holds.
    Sealed {
        end_offset: u64,
        data_bytes: u64,
        sealed_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub segment_id: u64,
    pub topic_id: u64,
    pub range_id: u32,
    pub state: SegmentState,
    pub created_ms: u64,
    /// Node ids; the first is the primary.
    pub replicas: Vec<u64>,
    /// Replicas that reported their file of this segment created, sorted. Until a replica has,
    /// a missing file there may be a create that never happened (a crash between metadata and
    /// the data plane); afterwards it is damage.
    #[serde(default)]
    pub created_on: Vec<u64>,
    /// Replicas whose copy of this sealed segment is settled, sorted: sealed at the recorded
    /// length with the recorded bytes, and intact when last checked. Readers prefer them;
    /// healing rebuilds the copies of the others from them. Empty while active.
    #[serde(default)]
    pub settled_on: Vec<u64>,
    /// Replicas healing is moving off this sealed segment. Each `old` stays a replica (its
    /// copy readable, a source for rebuilds) beside the `new` one that replaces it, until the
    /// new copy is reported settled: only then is the old one dropped, so a copy leaves the
    /// replica set only once another holds the same bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<ReplicaMove>,
    /// Brokers whose replica was dropped (a finished move) and whose files of it are not yet
    /// reported deleted, sorted. Such a broker deletes them when it sees itself here and
    /// reports it (`ReclaimDone`); until then it is no candidate for a new replica of this
    /// segment, so a copy being rebuilt is never mistaken for one to delete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<u64>,
    /// Records in this range before this segment's offset 0: offsets are per segment, this
    /// numbers records across the whole range (and so across retention).
    pub range_base_records: u64,
}

/// One replica of a sealed segment being moved to another broker (see `Segment::moves`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMove {
    pub old: u64,
    pub new: u64,
}

impl Segment {
    pub fn is_active(&self) -> bool {
        self.state == SegmentState::Active
    }

    /// Whether `node`'s replica is on its way out (a move off it is under way).
    pub fn is_moving_off(&self, node: u64) -> bool {
        self.moves.iter().any(|move_| move_.old == node)
    }

    /// The brokers that may hold files of this segment: its replicas and the dropped ones not
    /// yet reclaimed. Every one must delete its files when the segment goes.
    pub fn holders(&self) -> Vec<u64> {
        let mut holders = self.replicas.clone();
        holders.extend(self.dropped.iter().filter(|node| !self.replicas.contains(node)));
        holders
    }

    /// Records that `node`'s replica was dropped: its files are to be reclaimed.
    pub(crate) fn drop_replica(&mut self, node: u64) {
        self.replicas.retain(|&replica| replica != node);
        self.settled_on.retain(|&replica| replica != node);
        self.created_on.retain(|&replica| replica != node);
        self.record_dropped(node);
    }

    /// Records that `node` may hold files of this segment to delete.
    pub(crate) fn record_dropped(&mut self, node: u64) {
        if let Err(at) = self.dropped.binary_search(&node) {
            self.dropped.insert(at, node);
        }
    }

    /// The replicas that stay once every move under way has finished.
    pub fn staying_replicas(&self) -> Vec<u64> {
        self.replicas.iter().copied().filter(|&node| !self.is_moving_off(node)).collect()
    }

    /// `(end_offset, data_bytes)` once sealed.
    pub fn sealed_length(&self) -> Option<(u64, u64)> {
        match self.state {
            SegmentState::Active => None,
            SegmentState::Sealed { end_offset, data_bytes, .. } => Some((end_offset, data_bytes)),
        }
    }
}

/// Where the data plane fenced a segment: it closed the store and this is where it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealReport {
    pub segment_id: u64,
    /// Record count (offset one past the last record).
    pub end_offset: u64,
    pub data_bytes: u64,
}

/// A point inside one segment of one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    pub segment_id: u64,
    pub offset: u64,
}

/// A group's committed progress in one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupPosition {
    /// The next record to read.
    At(Position),
    /// The group drained this sealed range completely; readers continue in its children.
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroup {
    /// Bumped by every commit; a commit may name the generation it expects.
    pub generation: u64,
    pub positions: BTreeMap<u32, GroupPosition>,
    pub updated_ms: u64,
    /// The members sharing the group's ranges, when it has any (written only then, so a group
    /// without members stores what it did before membership existed).
    #[serde(default, skip_serializing_if = "Membership::is_empty")]
    pub membership: Membership,
}

/// Names one segment of one range of one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegmentRef {
    pub topic_id: u64,
    pub range_id: u32,
    pub segment_id: u64,
}

/// A segment whose metadata is gone and whose files the data plane still has to delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimEntry {
    pub topic_id: u64,
    pub range_id: u32,
    pub replicas: Vec<u64>,
}
