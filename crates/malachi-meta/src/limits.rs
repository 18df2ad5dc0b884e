//! Bounds on everything the metadata machine stores or accepts in one command. Does no I/O.
//!
//! The limits live inside [`crate::MetaState`] (and so in its snapshots and its hash): every
//! replica must refuse the same command for the same reason, so a limit cannot come from a
//! node's local configuration at apply time.

use serde::{Deserialize, Serialize};

/// Most ranges a topic may be created with (a power of two).
pub const MAX_INITIAL_RANGES: u32 = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaLimits {
    /// Live topics in one machine.
    pub max_topics: u32,
    /// Active ranges of one topic; a split beyond it is refused with `too_many_ranges`.
    pub max_active_ranges_per_topic: u32,
    /// Ranges of one topic ever created (active and sealed history); ids are `u32`.
    pub max_ranges_per_topic: u32,
    /// Retained segments of one range; a roll beyond it is refused with `too_many_segments`.
    pub max_segments_per_range: u32,
    /// Replicas of one segment.
    pub max_replicas_per_segment: u32,
    /// Consumer groups with committed positions on one topic.
    pub max_groups_per_topic: u32,
    /// Items (segment references or ids) in one expire or reclaim command.
    pub max_items_per_command: u32,
}

/// Node-wide resource bounds from the proposer's configuration (`MALACHI_MAX_TOPICS`,
/// `MALACHI_MAX_ACTIVE_RANGES`, `MALACHI_MAX_TOPICS_PER_USER`). They travel inside the commands
/// that grow the metadata, so every replica applies the same check to the same command; `None`
/// means no bound beyond [`MetaLimits`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Live topics in the machine.
    pub max_topics: Option<u32>,
    /// Active ranges over all topics: each holds an open write head on some broker.
    pub max_active_ranges: Option<u32>,
    /// Live topics one principal created; `creator: None` commands are exempt (admins).
    pub max_topics_per_creator: Option<u32>,
}

impl Default for MetaLimits {
    fn default() -> MetaLimits {
        MetaLimits {
            max_topics: 100_000,
            max_active_ranges_per_topic: 1_024,
            max_ranges_per_topic: 65_536,
            max_segments_per_range: 1_000_000,
            max_replicas_per_segment: 16,
            max_groups_per_topic: 10_000,
            max_items_per_command: 100_000,
        }
    }
}
