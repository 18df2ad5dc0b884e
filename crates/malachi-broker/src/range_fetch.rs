//! Reading one range with each record's position (wire key 31, `fetch_range`): the read path of
//! group members (`members.rs`), who read the ranges they are told and commit positions.

use std::time::Duration;

use malachi_log::Record;
use malachi_meta::Topic;

use crate::cursor::RangePosition;
use crate::error::LogError;
use crate::fetch::{FETCH_WAIT_MS_MAX, clamp_max, page_record_bytes_max};
use crate::members::history;
use crate::node::Broker;

/// Where a range read starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeStart {
    /// The oldest retained record.
    Earliest,
    /// After the last record: only what is produced from now on.
    Latest,
    /// A position: the range's index in its history (anything else is `invalid_cursor`:
    /// members read a range only after its ancestors) and a range-wide offset.
    At { source_index: u16, offset: u64 },
    /// The named group's committed position in this range (its start if the group never
    /// committed there).
    Group(String),
}

/// One page of one range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangePage {
    /// The range's index in its own history (its ancestors oldest first, then itself): the
    /// `source_index` of every position in this page.
    pub history_index: u16,
    /// Records with their range-wide offsets, ascending.
    pub records: Vec<(u64, Record)>,
    /// The offset the next page starts from.
    pub next: u64,
    /// Records after this page, up to the range's end when read.
    pub backlog: u64,
    /// Records retention removed between the start and this page's first record.
    pub expired: u64,
}

impl Broker {
    /// Up to `max` records (clamped like `fetch`) and about `bytes_max` bytes of `range_id`
    /// from `start`, waiting up to `wait_ms` for records when there are none.
    pub async fn fetch_range(
        &self,
        topic: &str,
        range_id: u32,
        start: RangeStart,
        (max, bytes_max, wait_ms): (u32, u64, u32),
    ) -> Result<RangePage, LogError> {
        self.see_topic(topic).await?;
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let depth = history(&topic, range_id).len();
        let Some(history_index) = depth.checked_sub(1) else {
            let unknown = malachi_meta::GroupError::NoSuchRange { range_id };
            return Err(LogError::Meta(unknown.into()));
        };
        let history_index = u16::try_from(history_index).map_err(|_| LogError::InvalidCursor)?;
        let max = clamp_max(max);
        let budget = page_record_bytes_max(self.config.max_frame_bytes, 1).min(bytes_max.max(1));
        if let RangeStart::At { source_index, .. } = start
            && source_index != history_index
        {
            return Err(LogError::InvalidCursor);
        }
        let mut offset = self.start_offset(&topic, range_id, start).await?;
        let deadline =
            tokio::time::sleep(Duration::from_millis(wait_ms.min(FETCH_WAIT_MS_MAX).into()));
        tokio::pin!(deadline);
        let mut produced = self.notifier.subscribe(topic.topic_id);
        let mut caught_up = false;
        loop {
            let topic_id = topic.topic_id;
            let topic = self
                .read_meta(topic_id, |meta| meta.topic(topic_id).cloned())
                .ok_or(LogError::NoSuchTopic)?;
            let read = self.read_range(&topic, range_id, offset, (max, budget, true)).await?;
            if read.records.is_empty() && read.behind && !caught_up {
                // This broker's metadata is behind the range's moves: catch up once, read again.
                caught_up = true;
                self.ring.named(&topic.name).group.read_barrier().await.map_err(|error| {
                    LogError::Unavailable(format!(
                        "behind topic {}'s metadata: {error}",
                        topic.name
                    ))
                })?;
                continue;
            }
            if !read.records.is_empty() || wait_ms == 0 || deadline.is_elapsed() {
                return Ok(page(history_index, read));
            }
            offset = match read.next {
                RangePosition::At(next) => next,
                RangePosition::Drained => return Ok(page(history_index, read)),
            };
            let parked = self.notifier.park(topic_id);
            tokio::select! {
                biased;
                _ = deadline.as_mut() => {}
                _ = produced.changed() => {}
            }
            drop(parked);
        }
    }

    async fn start_offset(
        &self,
        topic: &Topic,
        range_id: u32,
        start: RangeStart,
    ) -> Result<u64, LogError> {
        let committed = match start {
            RangeStart::Earliest => return Ok(0),
            RangeStart::At { offset, .. } => return Ok(offset),
            RangeStart::Latest => RangePosition::Drained,
            RangeStart::Group(group) => {
                let frontier = self.groups().group_frontier(topic, &group);
                frontier.get(&range_id).copied().unwrap_or(RangePosition::At(0))
            }
        };
        match committed {
            RangePosition::At(offset) => Ok(offset),
            // Nothing read, only the range's end found.
            RangePosition::Drained => {
                Ok(self.read_range(topic, range_id, 0, (0, 0, false)).await?.range_end)
            }
        }
    }
}

fn page(history_index: u16, read: crate::fetch::RangeRead) -> RangePage {
    let next = match read.next {
        RangePosition::At(offset) => offset,
        RangePosition::Drained => read.range_end,
    };
    let count = read.records.len();
    let offsets = read.runs.iter().flat_map(|&(first, count)| first..first + count);
    let records: Vec<(u64, Record)> = offsets.zip(read.records).collect();
    assert_eq!(records.len(), count, "every record read has an offset");
    RangePage {
        history_index,
        backlog: read.range_end.saturating_sub(next),
        expired: read.skipped,
        next,
        records,
    }
}
