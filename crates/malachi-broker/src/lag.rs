//! Consumer lag: for a consumer group and each range of its topic, the records between the
//! group's committed position and the range's end, and their sum for the topic.
//!
//! The group's committed positions are turned into a frontier as a group's reader would
//! resume from them (`frontier::from_committed`): the ranges it stands in are behind by
//! `end - position`; every range after them (their children, and theirs) is behind by all of
//! its retained records, since the group will read them all; ranges the frontier has left
//! behind (drained parents) are behind by nothing. A position older than what retention kept
//! counts from the oldest retained record: expired records can no longer be read, so they are
//! no lag. A range's end is its records' count across retention, the active head's as readers
//! see it (the quorum-durable end).

use std::collections::{BTreeMap, BTreeSet};

use crate::cursor::RangePosition;
use crate::error::LogError;
use crate::scrape::Observer;
use crate::topics::{RangeInfo, TopicInfo};

/// Where a group stands in one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The next range-wide offset the group reads.
    At(u64),
    /// The group read every record of this sealed range.
    Drained,
    /// The group has not reached this range yet: it reads all of it after its ancestors.
    Ahead,
}

/// One range's lag for a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLag {
    pub range_id: u32,
    pub active: bool,
    pub standing: Standing,
    /// Range-wide offset one past the range's last record.
    pub end: u64,
    pub lag: u64,
}

/// A group's lag over its topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLag {
    pub topic: String,
    pub group: String,
    /// Every range of the topic, in `range_id` order.
    pub ranges: Vec<RangeLag>,
    pub total: u64,
    /// When the group last committed (ms since the epoch); 0 if it never did.
    pub updated_ms: u64,
}

impl Observer {
    /// The lag of `group` on `topic`; a group that never committed stands at the start.
    pub async fn group_lag(&self, topic: &str, group: &str) -> Result<GroupLag, LogError> {
        let info = self.broker().describe_topic(topic).await?;
        Ok(self.lag_on(&info, group))
    }

    /// The lag of every group that committed on `topic` (sorted by group name), the topic's
    /// ends read once for all of them.
    pub async fn topic_group_lags(&self, topic: &str) -> Result<Vec<GroupLag>, LogError> {
        let info = self.broker().describe_topic(topic).await?;
        let groups = self.read_meta(info.topic_id, |meta| {
            meta.topic(info.topic_id)
                .map(|topic| topic.groups.keys().cloned().collect::<Vec<String>>())
                .unwrap_or_default()
        });
        Ok(groups.iter().map(|group| self.lag_on(&info, group)).collect())
    }

    fn lag_on(&self, info: &TopicInfo, group: &str) -> GroupLag {
        let topic = self.topic_named(&info.name);
        let frontier =
            topic.as_ref().map(|topic| self.broker().groups.group_frontier(topic, group));
        let updated_ms = self.read_meta(info.topic_id, |meta| {
            meta.group(info.topic_id, group).map_or(0, |state| state.updated_ms)
        });
        let ranges = range_lags(&info.ranges, &frontier.unwrap_or_default());
        let total = ranges.iter().map(|range| range.lag).sum();
        GroupLag { topic: info.name.clone(), group: group.to_string(), ranges, total, updated_ms }
    }
}

/// Each range's lag for a reader standing at `frontier` (see the module header).
pub fn range_lags(ranges: &[RangeInfo], frontier: &BTreeMap<u32, RangePosition>) -> Vec<RangeLag> {
    let by_id: BTreeMap<u32, &RangeInfo> = ranges.iter().map(|r| (r.range_id, r)).collect();
    let mut ahead = BTreeSet::new();
    let mut stack: Vec<u32> = frontier
        .keys()
        .filter_map(|id| by_id.get(id))
        .flat_map(|range| range.children.iter().copied())
        .collect();
    while let Some(range_id) = stack.pop() {
        if frontier.contains_key(&range_id) || !ahead.insert(range_id) {
            continue;
        }
        if let Some(range) = by_id.get(&range_id) {
            stack.extend(range.children.iter().copied());
        }
    }
    ranges
        .iter()
        .map(|range| {
            let retained_from = range.expired_records;
            let end = retained_from + range.records;
            let (standing, lag) = match frontier.get(&range.range_id) {
                Some(RangePosition::At(offset)) => {
                    (Standing::At(*offset), end.saturating_sub((*offset).max(retained_from)))
                }
                Some(RangePosition::Drained) => (Standing::Drained, 0),
                None if ahead.contains(&range.range_id) => (Standing::Ahead, range.records),
                None => (Standing::Drained, 0),
            };
            RangeLag { range_id: range.range_id, active: range.active, standing, end, lag }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(range_id: u32, children: &[u32], records: u64, expired: u64) -> RangeInfo {
        RangeInfo {
            range_id,
            start: 0,
            end_inclusive: 0,
            active: children.is_empty(),
            parents: Vec::new(),
            children: children.to_vec(),
            segments: 1,
            records,
            expired_records: expired,
        }
    }

    /// Range 0 split into 1 and 2; 2 split into 3 and 4.
    fn tree() -> Vec<RangeInfo> {
        vec![
            range(0, &[1, 2], 10, 0),
            range(1, &[], 5, 0),
            range(2, &[3, 4], 6, 2),
            range(3, &[], 7, 0),
            range(4, &[], 0, 0),
        ]
    }

    #[test]
    fn lag_table() {
        use RangePosition::{At, Drained};
        // (frontier, expected standing and lag per range 0..=4, total)
        type Case = (Vec<(u32, RangePosition)>, Vec<(Standing, u64)>, u64);
        let cases: Vec<Case> = vec![
            // Never read: everything from the start.
            (
                vec![(0, At(0))],
                vec![
                    (Standing::At(0), 10),
                    (Standing::Ahead, 5),
                    (Standing::Ahead, 6),
                    (Standing::Ahead, 7),
                    (Standing::Ahead, 0),
                ],
                28,
            ),
            // Half-way through the parent.
            (
                vec![(0, At(4))],
                vec![
                    (Standing::At(4), 6),
                    (Standing::Ahead, 5),
                    (Standing::Ahead, 6),
                    (Standing::Ahead, 7),
                    (Standing::Ahead, 0),
                ],
                24,
            ),
            // Parent drained, in the children; range 2's position is older than retention
            // kept (2 expired), so its lag counts from 2.
            (
                vec![(1, At(5)), (2, At(1))],
                vec![
                    (Standing::Drained, 0),
                    (Standing::At(5), 0),
                    (Standing::At(1), 6),
                    (Standing::Ahead, 7),
                    (Standing::Ahead, 0),
                ],
                13,
            ),
            // Caught up everywhere.
            (
                vec![(1, At(5)), (2, Drained), (3, At(7)), (4, At(0))],
                vec![
                    (Standing::Drained, 0),
                    (Standing::At(5), 0),
                    (Standing::Drained, 0),
                    (Standing::At(7), 0),
                    (Standing::At(0), 0),
                ],
                0,
            ),
        ];
        for (frontier, expected, total) in cases {
            let frontier: BTreeMap<u32, RangePosition> = frontier.into_iter().collect();
            let lags = range_lags(&tree(), &frontier);
            let found: Vec<(Standing, u64)> = lags.iter().map(|r| (r.standing, r.lag)).collect();
            assert_eq!(found, expected, "{frontier:?}");
            assert_eq!(lags.iter().map(|r| r.lag).sum::<u64>(), total, "{frontier:?}");
        }
    }
}
