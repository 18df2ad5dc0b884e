//! Fetch: read from a cursor, a group's committed position or the start, across range history,
//! with an optional long poll.
//!
//! Reads are served only from durable bytes (the segment store never shows more), ordered within
//! each range, at most `max` records per range (wire-protocol.md section 3.3), and the page never
//! exceeds what fits in one response frame.

use malachi_reason::Reason;
use std::collections::BTreeSet;
use std::time::Duration;

use std::sync::Arc;

use malachi_log::{ReadError, Record};
use malachi_meta::Topic;

use crate::cursor::{Cursor, RangePosition};
use crate::data::{DataError, Listed, SegmentKey};
use crate::error::LogError;
use crate::frontier::{self, Frontier};
use crate::node::Broker;
use crate::peer::Remote;

/// Clamps of wire-protocol.md section 3.3.
pub const FETCH_MAX_DEFAULT: u32 = 100;
pub const FETCH_MAX_LIMIT: u32 = 1000;
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;
/// Read barriers a fetch takes, at most, when it finds its metadata behind the topic's: a
/// pass reads the topic and then its segments, so a reshape committing in between can make a
/// pass behind again; a few catch-ups outlast any burst of reshapes.
const FETCH_CATCH_UPS_MAX: u32 = 3;
/// Room a response frame needs besides its records and cursor: length, corr, error code, count.
const PAGE_ENVELOPE_BYTES: u64 = 1024;

/// Wire bytes of records a page may carry so that the whole response, with a cursor of up to
/// `frontier_entries` entries, stays within the frame limit.
pub fn page_record_bytes_max(max_frame_bytes: u32, frontier_entries: usize) -> u64 {
    let cursor = crate::cursor::text_bytes_bound(frontier_entries) as u64;
    u64::from(max_frame_bytes).saturating_sub(PAGE_ENVELOPE_BYTES + cursor)
}

#[derive(Clone, Debug, Default)]
pub struct FetchArgs<'a> {
    pub topic: &'a str,
    pub cursor: Option<&'a [u8]>,
    pub group: Option<&'a str>,
    pub member: Option<&'a str>,
    pub max: u32,
    pub wait_ms: u32,
    /// A cap on the whole page (a subscription's remaining credit); `None` is per range only.
    pub total_max: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchPage {
    pub records: Vec<Record>,
    pub next_cursor: String,
    /// Records the reader's position pointed at that retention had already deleted.
    pub skipped: u64,
}

/// What reading one range returned.
pub(crate) struct RangeRead {
    pub(crate) records: Vec<Record>,
    pub(crate) next: RangePosition,
    /// The range-wide offsets of `records`: (first, count) per run read from one segment.
    pub(crate) runs: Vec<(u64, u64)>,
    /// One past the range's last record, as this read found it.
    pub(crate) range_end: u64,
    pub(crate) skipped: u64,
    wire_bytes: u64,
    /// A head this broker's metadata calls active is sealed where it is held: this broker is
    /// behind the range's moves, and records past it may exist that it does not know of.
    pub(crate) behind: bool,
}

/// Where an active segment ends, as the broker holding it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeadEnd {
    pub(crate) offset: u64,
    pub(crate) sealed: bool,
}

/// What one metadata version says of a range's records.
struct RangeLayout {
    /// Records before the first segment left, removed by retention.
    expired_records: u64,
    spans: Vec<SegmentSpan>,
}

/// One retained segment of a range as a reader needs it.
#[derive(Clone, Copy, Debug)]
struct SegmentSpan {
    segment_id: u64,
    base: u64,
    sealed_end: Option<u64>,
}

pub fn clamp_max(max: u32) -> u32 {
    if max == 0 { FETCH_MAX_DEFAULT } else { max.min(FETCH_MAX_LIMIT) }
}

/// Bytes a record takes in a fetch response (wire-protocol.md section 2.1).
pub fn wire_bytes(record: &Record) -> u64 {
    let key = record.key.as_ref().map_or(1, |key| 5 + key.len() as u64);
    let headers: u64 =
        record.headers.iter().map(|(name, value)| 10 + (name.len() + value.len()) as u64).sum();
    key + 4 + record.value.len() as u64 + 8 + 4 + headers
}

/// What one pass of a fetch came to.
enum Pass {
    Page(FetchPage),
    /// Nothing to read, and this broker found its metadata behind the topic's (a head sealed
    /// where it is held, a segment already removed there): catch up and read again.
    Behind,
}

impl Broker {
    /// Reads a page. A broker whose metadata lags (cut off, or a moment behind) must not answer
    /// an empty page where a reader through another broker would find records, nor read a
    /// deleted incarnation of a topic in place of the new one: once a pass finds it is behind,
    /// it takes a read barrier and reads again with the name resolved anew, and a barrier it
    /// cannot take is `metadata_unavailable`, never an empty page.
    pub async fn fetch(&self, args: &FetchArgs<'_>) -> Result<FetchPage, LogError> {
        self.see_topic(args.topic).await?;
        // One long poll for the whole fetch, whatever the passes: the runtime's timer, not a
        // clock read, so under the simulator's paused time it is virtual.
        let wait_ms = args.wait_ms.min(FETCH_WAIT_MS_MAX);
        let deadline = tokio::time::sleep(Duration::from_millis(u64::from(wait_ms)));
        tokio::pin!(deadline);
        for catch_up in 0..=FETCH_CATCH_UPS_MAX {
            let last = catch_up == FETCH_CATCH_UPS_MAX;
            if let Pass::Page(page) = self.fetch_pass(args, deadline.as_mut(), last).await? {
                let bytes = page.records.iter().map(wire_bytes).sum();
                self.metrics.fetched(args.topic, page.records.len() as u64, bytes);
                return Ok(page);
            }
            tracing::debug!(
                node = self.node_id,
                topic = args.topic,
                catch_up,
                "fetch found this broker behind"
            );
            self.ring.named(args.topic).group.read_barrier().await.map_err(|error| {
                LogError::Unavailable(format!(
                    "this broker's metadata is behind topic {}'s, and {error}",
                    args.topic
                ))
            })?;
        }
        unreachable!("the last pass answers a page")
    }

    /// One pass, waiting for records until `deadline`; `last` answers a page even when it
    /// finds this broker behind.
    async fn fetch_pass(
        &self,
        args: &FetchArgs<'_>,
        mut deadline: std::pin::Pin<&mut tokio::time::Sleep>,
        last: bool,
    ) -> Result<Pass, LogError> {
        let max = clamp_max(args.max);
        let Some(topic) = self.topic_named(args.topic) else {
            tracing::debug!(
                node = self.node_id,
                topic = args.topic,
                "fetch of a topic unknown here"
            );
            // The original answers an unknown topic with an empty page.
            return Ok(Pass::Page(FetchPage::default()));
        };
        let mut frontier = self.start_frontier(&topic, args)?;
        let mut produced = self.notifier.subscribe(topic.topic_id);
        loop {
            let topic_id = topic.topic_id;
            let Some(topic) = self.read_meta(topic_id, |meta| meta.topic(topic_id).cloned()) else {
                // Deleted while we waited: an empty page, as for a topic that never existed.
                return Ok(Pass::Page(FetchPage::default()));
            };
            let (records, skipped, behind) =
                self.read_frontier(&topic, &mut frontier, max, args.total_max).await?;
            if records.is_empty() && behind && !last {
                return Ok(Pass::Behind);
            }
            if !records.is_empty() || args.wait_ms == 0 || deadline.is_elapsed() {
                let cursor = Cursor { topic_id: topic.topic_id, positions: frontier };
                let next_cursor = self.mint_cursor(&cursor)?;
                return Ok(Pass::Page(FetchPage { records, next_cursor, skipped }));
            }
            let parked = self.notifier.park(topic.topic_id);
            tokio::select! {
                biased;
                _ = deadline.as_mut() => {}
                // An error means the topic was deleted: the next pass finds it gone and answers.
                _ = produced.changed() => {}
            }
            drop(parked);
        }
    }

    /// The frontier a fetch starts from, by the precedence of wire-protocol.md section 3.3.
    fn start_frontier(&self, topic: &Topic, args: &FetchArgs<'_>) -> Result<Frontier, LogError> {
        if let (Some(group), Some(member)) = (args.group, args.member) {
            return Ok(self.groups.member_frontier(topic, group, member));
        }
        // A cursor that is present is decoded, even when empty: the original answers an empty
        // cursor `invalid_cursor`, and only an absent one means "from the start".
        if let Some(text) = args.cursor {
            return self.decode_cursor(topic, text);
        }
        if let Some(group) = args.group {
            return Ok(self.groups.group_frontier(topic, group));
        }
        Ok(frontier::initial(topic))
    }

    /// The text of a reader's position. A frontier over more ranges than a cursor holds (only a
    /// pathological reshaping history makes one) is refused, never minted with a wrapped count.
    pub(crate) fn mint_cursor(&self, cursor: &Cursor) -> Result<String, LogError> {
        let entries = cursor.positions.len();
        self.cursors.encode(cursor).map_err(|_| LogError::FrontierTooWide { entries })
    }

    /// Decodes and checks a client's cursor: our tag, our topic, ranges that exist and do not
    /// overlap (a group member's cursor covers only its ranges, so it need not tile).
    pub(crate) fn decode_cursor(&self, topic: &Topic, text: &[u8]) -> Result<Frontier, LogError> {
        let cursor =
            self.cursors.decode(text, topic.topic_id).map_err(|_| LogError::InvalidCursor)?;
        let mut positions = cursor.positions;
        frontier::validate_partial(topic, &positions).map_err(|_| LogError::InvalidCursor)?;
        frontier::advance(topic, &mut positions);
        Ok(positions)
    }

    /// Reads every range of the frontier once (children released by a drained parent are read
    /// in the same call), up to `max` records per range and one page of bytes in all.
    async fn read_frontier(
        &self,
        topic: &Topic,
        frontier: &mut Frontier,
        max: u32,
        total_max: Option<u32>,
    ) -> Result<(Vec<Record>, u64, bool), LogError> {
        let mut total_left = total_max.unwrap_or(u32::MAX);
        let mut behind = false;
        let mut records = Vec::new();
        let mut skipped = 0;
        let mut visited = BTreeSet::new();
        let max_frame_bytes = self.config.max_frame_bytes;
        let mut used = 0u64;
        frontier::advance(topic, frontier);
        loop {
            // The frontier can grow while children are released: reserve for twice its size.
            let budget = page_record_bytes_max(max_frame_bytes, 2 * frontier.len() + 16)
                .saturating_sub(used);
            let unread: Vec<(u32, u64)> = frontier
                .iter()
                .filter_map(|(&range_id, position)| match position {
                    RangePosition::At(offset) if !visited.contains(&range_id) => {
                        Some((range_id, *offset))
                    }
                    _ => None,
                })
                .collect();
            if unread.is_empty() || budget == 0 || total_left == 0 {
                return Ok((records, skipped, behind));
            }
            for (range_id, offset) in unread {
                if total_left == 0 {
                    break;
                }
                visited.insert(range_id);
                let budget = page_record_bytes_max(max_frame_bytes, 2 * frontier.len() + 16)
                    .saturating_sub(used);
                let limits = (max.min(total_left), budget, records.is_empty());
                let read = self.read_range(topic, range_id, offset, limits).await?;
                total_left -= read.records.len() as u32;
                used += read.wire_bytes;
                skipped += read.skipped;
                behind |= read.behind;
                records.extend(read.records);
                frontier.insert(range_id, read.next);
            }
            frontier::advance(topic, frontier);
        }
    }

    /// Reads one range from `offset`: at most `max` records and `budget` wire bytes; an
    /// over-budget record is taken only when `page_empty` (so one record always fits a page
    /// alone, and never overflows one).
    pub(crate) async fn read_range(
        &self,
        topic: &Topic,
        range_id: u32,
        mut offset: u64,
        (max, budget, page_empty): (u32, u64, bool),
    ) -> Result<RangeRead, LogError> {
        let range = &topic.ranges[&range_id];
        let mut read = RangeRead {
            records: Vec::new(),
            next: RangePosition::At(offset),
            runs: Vec::new(),
            range_end: offset,
            skipped: 0,
            wire_bytes: 0,
            behind: false,
        };
        // Retention may have removed segments since `range` was read, so what it expired is
        // taken from the same metadata version as the segments left: the records before the
        // first of them, or all of a sealed range's records once none is left (found by the
        // cluster simulator twice: a drain racing an expiry skipped records without reporting
        // them, first of a range's front, then of a split range's last segment).
        let layout = self.range_layout(topic.topic_id, range_id);
        let expired = layout.expired_records.max(range.expired_records);
        if offset < expired {
            read.skipped = expired - offset;
            offset = expired;
        }
        let mut spans: Vec<(SegmentSpan, u64)> = Vec::new();
        for span in layout.spans {
            let length = match span.sealed_end {
                Some(end_offset) => end_offset,
                None => {
                    let key = SegmentKey {
                        topic_id: topic.topic_id,
                        range_id,
                        segment_id: span.segment_id,
                    };
                    // Rolled, split or deleted where it is held: this broker's metadata is
                    // behind, nothing more to read here until it catches up.
                    match self.segment_end(key).await? {
                        Some(end) => {
                            read.behind |= end.sealed;
                            end.offset
                        }
                        None => {
                            read.behind = true;
                            0
                        }
                    }
                }
            };
            spans.push((span, span.base + length));
        }
        // An active range's last segment is its head, never sealed in one metadata version: a
        // sealed one means the range moved on (a roll, split or merge) after `range` was read.
        if range.is_active() && spans.last().is_some_and(|(span, _)| span.sealed_end.is_some()) {
            read.behind = true;
        }
        let range_end = spans.last().map_or(offset, |(_, end)| *end);
        read.range_end = range_end;
        let mut full = false;
        for (span, end) in spans {
            if end <= offset {
                continue;
            }
            if full || read.records.len() as u32 >= max {
                break;
            }
            offset = offset.max(span.base);
            let key =
                SegmentKey { topic_id: topic.topic_id, range_id, segment_id: span.segment_id };
            // Never past the span's end: a sealed segment ends where metadata recorded its
            // seal, whatever its file holds (the simulator's skip-split-fence canary showed
            // reads quietly returning records a broken fence let in after the end).
            let wanted = (max - read.records.len() as u32).min(span_records(offset, end));
            let bytes_left = budget.saturating_sub(read.wire_bytes).max(1);
            let from = offset - span.base;
            let Some(records) = self.read_segment(key, from, wanted, bytes_left).await? else {
                // Metadata dropped it after we looked (retention): count it as expired. A
                // segment metadata still lists but whose file is missing is damage instead.
                // Where it is held it may have gone while this broker's metadata lags (a
                // deleted topic's): behind, so an empty page is read again after a barrier.
                read.behind = true;
                read.skipped += end - offset;
                offset = end;
                continue;
            };
            let got = records.len();
            let run_first = offset;
            let run_before = read.records.len();
            if got == 0 {
                // Metadata says records lie here and the segment has none to give (a sealed
                // file shorter than its recorded end): damage, never a silent end of the range.
                return Err(LogError::Storage {
                    reason: Reason::StorageDamaged,
                    detail: format!("segment {key:?} holds no record at offset {from}"),
                });
            }
            for record in records {
                let bytes = wire_bytes(&record);
                let alone = page_empty && read.records.is_empty();
                if read.wire_bytes + bytes > budget && !alone {
                    full = true;
                    break;
                }
                read.wire_bytes += bytes;
                read.records.push(record);
                offset += 1;
            }
            let run_records = (read.records.len() - run_before) as u64;
            if run_records > 0 {
                read.runs.push((run_first, run_records));
            }
            // A segment read that stopped short (its byte budget, a page limit) ends this
            // range's part of the page: moving to the next segment would skip the rest.
            if got == 0 || offset < end {
                break;
            }
        }
        let drained = !range.is_active() && offset >= range_end;
        read.next = if drained { RangePosition::Drained } else { RangePosition::At(offset) };
        Ok(read)
    }

    /// Up to `wanted` records (about `bytes_max` bytes) of segment `key` from `from`, from a
    /// copy that holds them; `None` once metadata no longer lists the segment. An active
    /// segment is read where its primary is (the one copy that knows what a quorum holds); a
    /// sealed one from this broker's copy if it holds one, else from the other replicas in
    /// turn, and a copy that is damaged or short is passed over for the next.
    pub(crate) async fn read_segment(
        &self,
        key: SegmentKey,
        from: u64,
        wanted: u32,
        bytes_max: u64,
    ) -> Result<Option<Vec<Record>>, LogError> {
        let Some((replicas, settled_on)) = self.read_meta(key.segment_id, |meta| {
            let segment = meta.segment(key.segment_id)?;
            Some((segment.replicas.clone(), segment.settled_on.clone()))
        }) else {
            return Ok(None);
        };
        let sealed = matches!(self.listed(key), Some(Listed::Sealed { .. }));
        let mut last_error = None;
        for copy in read_order(self.node_id, &replicas, &settled_on, sealed) {
            let outcome = if copy == self.node_id {
                let read = self.read_copy(key, from, wanted, bytes_max).await;
                if sealed
                    && settled_on.contains(&copy)
                    && matches!(&read, Err(error) if error.kind() == Some(Reason::StorageDamaged))
                {
                    // Damage found by a read: this copy leaves the read path, healing
                    // rebuilds it.
                    if let Some(broker) = self.self_handle() {
                        tokio::spawn(async move { broker.healer.unsettle_here(key).await });
                    }
                }
                read
            } else {
                match self.remote_read(copy, key, (from, wanted, bytes_max)).await {
                    Ok(Remote::Done(records)) => Ok(Some(records)),
                    Ok(Remote::FencedOrGone) => Ok(None),
                    Err(error) => Err(error),
                }
            };
            match outcome {
                Ok(Some(records)) if !records.is_empty() || wanted == 0 => {
                    return Ok(Some(records));
                }
                Ok(Some(records)) => last_error.get_or_insert(Ok(Some(records))),
                Ok(None) => return Ok(None),
                Err(error) => {
                    tracing::debug!(?key, copy, %error, "a copy could not serve a read");
                    last_error.get_or_insert(Err(error))
                }
            };
        }
        last_error.unwrap_or(Ok(None))
    }

    /// Reads this broker's own copy of `key`; an active replicated copy only up to what a
    /// quorum holds, as far as this broker knows.
    pub(crate) async fn read_copy(
        &self,
        key: SegmentKey,
        from: u64,
        wanted: u32,
        bytes_max: u64,
    ) -> Result<Option<Vec<Record>>, LogError> {
        let segment = match self.segment(key).await {
            Ok(segment) => segment,
            Err(DataError::Gone(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let wanted = match self.replicator.visible_end(key) {
            Some(visible) if !matches!(self.listed(key), Some(Listed::Sealed { .. })) => {
                wanted.min(span_records(from, visible))
            }
            _ => wanted,
        };
        let batch = match self.data.read(Arc::clone(&segment), from, wanted, bytes_max).await {
            // A write or seal that failed poisoned the head; if no produce comes to repair it,
            // the reader must (found by the simulator: a drained topic read `storage_failed`
            // forever after a full disk). Reopened, it holds exactly the durable records,
            // which are all a reader may see anyway.
            Err(ReadError::Poisoned { .. }) => {
                self.repair_poisoned(key, &segment);
                let segment = self.segment(key).await?;
                self.data.read(segment, from, wanted, bytes_max).await
            }
            other => other,
        }
        .map_err(|error| {
            tracing::warn!(?key, %error, "a segment read failed");
            DataError::from(error)
        })?;
        Ok(Some(batch.records.into_iter().map(|stored| stored.record).collect()))
    }

    /// Where active segment `key` ends for readers (what a quorum of its replicas holds), and
    /// whether the head is sealed there already (a broker whose metadata still calls it active
    /// is behind: the range moved on); `None` once metadata no longer lists it. Asked of the
    /// primary; of the other replicas if it cannot answer.
    pub(crate) async fn segment_end(&self, key: SegmentKey) -> Result<Option<HeadEnd>, LogError> {
        let Some(replicas) = self.replicator.replicas(key) else { return Ok(None) };
        let mut last_error = None;
        for copy in read_order(self.node_id, &replicas, &[], false) {
            let outcome = if copy == self.node_id {
                self.local_end(key).await
            } else {
                match self.remote_end(copy, key).await {
                    Ok(Remote::Done(end)) => Ok(Some(end)),
                    Ok(Remote::FencedOrGone) => Ok(None),
                    Err(error) => Err(error),
                }
            };
            match outcome {
                Err(error) => {
                    last_error.get_or_insert(error);
                }
                done => return done,
            }
        }
        Err(last_error.unwrap_or(LogError::NoSuchTopic))
    }

    /// Where this broker's copy of active segment `key` ends for readers.
    pub(crate) async fn local_end(&self, key: SegmentKey) -> Result<Option<HeadEnd>, LogError> {
        let durable = match self.active_durable_end(key).await {
            Ok(durable) => durable,
            Err(DataError::Gone(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let sealed = self.data.peek(key).is_some_and(|segment| segment.status().sealed.is_some());
        let Some(offset) = self.replicator.readable_end(key, durable) else {
            // A primary that restarted since it created the head does not know what a quorum
            // holds: failover seals the head first (found in CI: a reader that met a head
            // sealed a moment ago, or created a moment ago, was told `migrating`).
            self.coordination.request_roll(key.topic_id, key.range_id);
            return Err(LogError::Migrating);
        };
        Ok(Some(HeadEnd { offset, sealed }))
    }

    /// A range's segments and the records retention removed before them, from one metadata
    /// version; empty once the topic is gone.
    fn range_layout(&self, topic_id: u64, range_id: u32) -> RangeLayout {
        self.read_meta(topic_id, |meta| {
            let expired_records = meta
                .topic(topic_id)
                .and_then(|topic| topic.ranges.get(&range_id))
                .map_or(0, |range| range.expired_records);
            let spans: Vec<SegmentSpan> = meta
                .range_segments(topic_id, range_id)
                .iter()
                .map(|segment| SegmentSpan {
                    segment_id: segment.segment_id,
                    base: segment.range_base_records,
                    sealed_end: segment.sealed_length().map(|(end_offset, _)| end_offset),
                })
                .collect();
            assert!(
                spans.first().is_none_or(|first| first.base == expired_records),
                "retention expires only a range's front"
            );
            RangeLayout { expired_records, spans }
        })
    }
}

/// The copies of a segment (`replicas`, the primary first) a read tries, in order: of a
/// sealed segment the settled copies first (this broker's own first), then the others (a copy
/// not settled yet holds what it holds; a short or damaged one passes the read on); of an
/// active one only the primary's, the one copy that knows what a quorum holds (a follower
/// knows only what its primary last told it, which may lag what was acknowledged: reading
/// there could miss acknowledged records, and an active head with no primary to answer is
/// sealed by failover soon).
fn read_order(node_id: u64, replicas: &[u64], settled_on: &[u64], sealed: bool) -> Vec<u64> {
    if !sealed {
        return replicas.first().copied().into_iter().collect();
    }
    let mut order: Vec<u64> = Vec::with_capacity(replicas.len());
    let settled = |copy: &u64| settled_on.contains(copy);
    let mine = replicas.iter().filter(|&&copy| copy == node_id);
    let ranked = mine.clone().filter(|c| settled(c)).chain(replicas.iter().filter(|c| settled(c)));
    for &copy in ranked.chain(mine).chain(replicas) {
        if !order.contains(&copy) {
            order.push(copy);
        }
    }
    order
}

/// Records left in a span from `offset` to `end`, as a read limit.
fn span_records(offset: u64, end: u64) -> u32 {
    u32::try_from(end.saturating_sub(offset)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod read_order_tests {
    use super::read_order;

    /// This broker, the replicas, the settled copies, sealed, the order a read tries.
    type Case<'a> = (u64, &'a [u64], &'a [u64], bool, &'a [u64]);

    #[test]
    fn reads_prefer_settled_copies_and_active_heads_their_primary() {
        let cases: &[Case] = &[
            (2, &[1, 2, 3], &[], false, &[1]),
            (2, &[1, 2, 3], &[1, 2, 3], false, &[1]),
            (2, &[1, 2, 3], &[1, 2, 3], true, &[2, 1, 3]),
            (2, &[1, 2, 3], &[1, 3], true, &[1, 3, 2]),
            (4, &[1, 2, 3], &[3], true, &[3, 1, 2]),
            (4, &[1, 2, 3], &[], true, &[1, 2, 3]),
            (3, &[1, 2, 3], &[], true, &[3, 1, 2]),
            (1, &[1], &[], true, &[1]),
        ];
        for &(me, replicas, settled, sealed, expected) in cases {
            assert_eq!(
                read_order(me, replicas, settled, sealed),
                expected,
                "me {me}, replicas {replicas:?}, settled {settled:?}, sealed {sealed}"
            );
        }
    }
}
