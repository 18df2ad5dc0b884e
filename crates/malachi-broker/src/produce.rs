//! Produce: route each record to the active range owning its key, append per range (one group
//! commit per segment), acknowledge once every append is durable.
//!
//! A write head sealed under us (a split, merge or roll) is the fence doing its job: the records
//! that were refused are re-routed against fresh metadata and retried, in order, so a key's
//! records land after the parent's in the child. Appends that failed on storage are not retried
//! here: their outcome is unknown, so the client decides (at-least-once).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use malachi_log::{AppendError, Record};
use malachi_meta::key_point;

use crate::data::{DataError, SegmentKey};
use crate::error::LogError;
use crate::node::Broker;
use crate::peer::Remote;
use crate::replica::ReplicatedAppendError;

/// How long a produce re-routes records whose head was fenced (a roll, split or merge under
/// way) before answering `migrating`. A roll creates the new head on every replica with an
/// fsync each; on a loaded machine that took longer than the 0.6 s that 64 attempts covered,
/// and a CI run saw a plain produce refused with `migrating` right after a roll.
const ROUTE_WAIT_MS_MAX: u64 = 10_000;

/// The longest pause between two routing passes; the pause grows by 1 ms per pass to it.
const ROUTE_PAUSE_MS_MAX: u64 = 20;

/// Per-connection producer state: where keyless records go next.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    next: u64,
}

/// What one part of a routing pass came to: records to re-route, the first failure, and
/// whether any records were appended.
#[derive(Default)]
pub(crate) struct Pass {
    pub(crate) fenced: Vec<usize>,
    pub(crate) failure: Option<LogError>,
    pub(crate) appended_any: bool,
}

impl Pass {
    fn merge(&mut self, other: Pass) {
        self.fenced.extend(other.fenced);
        self.appended_any |= other.appended_any;
        if let Some(error) = other.failure {
            self.failure.get_or_insert(error);
        }
    }
}

/// Records bound for one segment, with their positions in the request.
pub(crate) struct RangeBatch {
    pub(crate) key: SegmentKey,
    pub(crate) indexes: Vec<usize>,
}

impl Broker {
    /// Appends `records` to `topic`; returns the count once all are durable.
    pub async fn produce(
        &self,
        topic: &str,
        records: Vec<Record>,
        spread: &mut Spread,
    ) -> Result<u32, LogError> {
        let count =
            u32::try_from(records.len()).map_err(|_| LogError::Limit(too_many(records.len())))?;
        self.see_topic(topic).await?;
        let topic_id = self.topic_id(topic)?;
        if records.is_empty() {
            return Ok(0);
        }
        self.data.config().limits.check(&records)?;
        let bytes: u64 = records.iter().map(Record::user_bytes).sum();
        // Keyless records pick a slot once, so a retry keeps them where they were headed.
        let slots: Vec<u64> = records
            .iter()
            .map(|record| {
                if record.key.is_some() {
                    return 0;
                }
                spread.next = spread.next.wrapping_add(1);
                spread.next
            })
            .collect();
        let mut pending: Vec<usize> = (0..records.len()).collect();
        let deadline_ms = self.clock.now_ms().saturating_add(ROUTE_WAIT_MS_MAX);
        for pass in 0_u64.. {
            pending = self.append_routed(topic_id, &records, &slots, pending).await?;
            if pending.is_empty() {
                self.notifier.notify(topic_id);
                self.metrics.produced(topic, u64::from(count), bytes);
                return Ok(count);
            }
            if self.clock.now_ms() >= deadline_ms {
                break;
            }
            // Let the reshape that fenced the head finish before routing again.
            tokio::time::sleep(Duration::from_millis(pass.min(ROUTE_PAUSE_MS_MAX))).await;
        }
        Err(LogError::Migrating)
    }

    /// One routing pass: appends every pending record to its range's head (here, or on the
    /// broker holding it) and returns the records whose head turned out to be fenced.
    async fn append_routed(
        &self,
        topic_id: u64,
        records: &[Record],
        slots: &[u64],
        pending: Vec<usize>,
    ) -> Result<Vec<usize>, LogError> {
        let mut local = Vec::new();
        let mut remote = Vec::new();
        for batch in self.route(topic_id, records, slots, pending)? {
            match self.holder_elsewhere(batch.key) {
                Some(holder) => remote.push((holder, batch)),
                None => local.push(batch),
            }
        }
        let forwarded = remote.iter().map(|(holder, batch)| {
            let owned: Vec<Record> = batch.indexes.iter().map(|&at| records[at].clone()).collect();
            async move { self.remote_append(*holder, batch.key, owned).await }
        });
        let (local, forwarded) =
            tokio::join!(self.append_local(local, records), join_all(forwarded));
        let mut passes = vec![local];
        for ((_, batch), outcome) in remote.into_iter().zip(forwarded) {
            passes.push(match outcome {
                Ok(Remote::Done(())) => Pass { appended_any: true, ..Pass::default() },
                Ok(Remote::FencedOrGone) => Pass { fenced: batch.indexes, ..Pass::default() },
                Err(error) => {
                    self.after_unreachable_primary(batch.key, &error);
                    Pass { failure: Some(error), ..Pass::default() }
                }
            });
        }
        let appended_any = passes.iter().any(|pass| pass.appended_any);
        let mut fenced = Vec::new();
        let mut failure = None;
        for pass in passes {
            fenced.extend(pass.fenced);
            if let Some(error) = pass.failure {
                failure.get_or_insert(error);
            }
        }
        match failure {
            Some(error) => {
                // Ranges that did take their records must still wake their long polls, and the
                // answer must not claim nothing was written: a definite refusal becomes a
                // retryable one whose outcome the client does not know.
                if appended_any {
                    self.notifier.notify(topic_id);
                    if matches!(error, LogError::NoSuchTopic | LogError::Meta(_)) {
                        return Err(LogError::Migrating);
                    }
                }
                Err(error)
            }
            None => {
                fenced.sort_unstable();
                Ok(fenced)
            }
        }
    }

    /// A forward to the primary of a replicated head that did not reach it (a broker killed,
    /// cut off or gone) asks for the head's roll at once: its followers can seal it by
    /// failover without waiting for membership to call the primary dead (the producer's retry
    /// then meets the new head). A primary that is in fact alive only loses its head early.
    fn after_unreachable_primary(&self, key: SegmentKey, error: &LogError) {
        let replicated = self.replicator.replicas(key).is_some_and(|replicas| replicas.len() > 1);
        if replicated && matches!(error, LogError::Unavailable(_)) {
            tracing::info!(?key, %error, "the primary is out of reach: asking for a roll");
            self.coordination.request_roll(key.topic_id, key.range_id);
        }
    }

    /// Appends the batches bound for this broker's own heads: those it holds alone through
    /// one round of the group commit, the replicated ones it is the primary of through their
    /// replication, all at once.
    pub(crate) async fn append_local(&self, batches: Vec<RangeBatch>, records: &[Record]) -> Pass {
        let mut pass = Pass::default();
        let mut plain = Vec::with_capacity(batches.len());
        let mut replicated = Vec::new();
        for batch in batches {
            let segment = match self.segment(batch.key).await {
                Ok(segment) => segment,
                Err(error) => {
                    pass.failure = Some(error.into());
                    return pass;
                }
            };
            match self.replicator.role(batch.key) {
                Some(crate::replica::Role::Primary { .. }) => replicated.push((batch, segment)),
                _ => plain.push((batch, segment)),
            }
        }
        let replicated = join_all(replicated.into_iter().map(|(batch, segment)| async move {
            let owned: Vec<Record> = batch.indexes.iter().map(|&at| records[at].clone()).collect();
            let bytes = owned.iter().map(Record::user_bytes).sum::<u64>();
            let outcome =
                self.replicator.append_replicated(batch.key, Arc::clone(&segment), owned).await;
            (batch, bytes, segment, outcome)
        }));
        let (plain, replicated) = tokio::join!(self.append_plain(plain, records), replicated);
        pass.merge(plain);
        for (batch, bytes, segment, outcome) in replicated {
            let outcome = match outcome {
                Ok(ticket) => Ok(ticket),
                Err(ReplicatedAppendError::Append(error)) => Err(error),
                Err(ReplicatedAppendError::NoQuorum) => {
                    pass.failure.get_or_insert(LogError::NoQuorum(format!(
                        "the replicas of range {} did not acknowledge in time",
                        batch.key.range_id
                    )));
                    continue;
                }
            };
            self.after_outcome(&mut pass, batch, bytes, &segment, outcome);
        }
        pass
    }

    /// Appends batches to heads this broker holds alone: every range's records are staged
    /// first and then wait together, so one round of the node's group commit covers the whole
    /// request, whatever the number of ranges.
    async fn append_plain(
        &self,
        batches: Vec<(RangeBatch, Arc<malachi_log::Segment>)>,
        records: &[Record],
    ) -> Pass {
        let mut pass = Pass::default();
        let mut appends = Vec::with_capacity(batches.len());
        let mut sizes = Vec::with_capacity(batches.len());
        for (batch, segment) in &batches {
            let owned: Vec<Record> = batch.indexes.iter().map(|&at| records[at].clone()).collect();
            sizes.push(owned.iter().map(Record::user_bytes).sum::<u64>());
            appends.push((Arc::clone(segment), owned));
        }
        let outcomes = self.data.append_all(appends).await;
        for (((batch, segment), bytes), outcome) in batches.into_iter().zip(sizes).zip(outcomes) {
            self.after_outcome(&mut pass, batch, bytes, &segment, outcome);
        }
        pass
    }

    /// What one batch's append came to, into `pass`.
    fn after_outcome(
        &self,
        pass: &mut Pass,
        batch: RangeBatch,
        bytes: u64,
        segment: &Arc<malachi_log::Segment>,
        outcome: Result<malachi_log::AppendTicket, AppendError>,
    ) {
        match outcome {
            Ok(_) => {
                let active_bytes = segment.status().durable_bytes;
                self.after_append(batch.key, batch.indexes.len() as u64, bytes, active_bytes);
                pass.appended_any = true;
            }
            Err(AppendError::Sealed { .. }) => {
                // A reshape sealed it under us (it moves the head on), or one stopped
                // after its seal (a crash, a refusal): the roll asked for completes it.
                self.coordination.request_roll(batch.key.topic_id, batch.key.range_id);
                pass.fenced.extend(batch.indexes);
            }
            Err(error) => {
                if let AppendError::Poisoned { cause } = error {
                    tracing::error!(key = ?batch.key, %cause, "an append failed on storage");
                    self.repair_poisoned(batch.key, segment);
                }
                pass.failure.get_or_insert(LogError::from(DataError::Append(error)));
            }
        }
    }

    /// Groups pending records by the head segment of the range that owns them, keeping each
    /// group in request order.
    fn route(
        &self,
        topic_id: u64,
        records: &[Record],
        slots: &[u64],
        pending: Vec<usize>,
    ) -> Result<Vec<RangeBatch>, LogError> {
        self.read_meta(topic_id, |meta| {
            let topic = meta.topic(topic_id).ok_or(LogError::NoSuchTopic)?;
            let active: Vec<u32> = topic.active_ranges().map(|range| range.range_id).collect();
            let mut by_range: BTreeMap<u32, RangeBatch> = BTreeMap::new();
            for at in pending {
                let range = match &records[at].key {
                    Some(key) => topic.route(key_point(key)),
                    None => &topic.ranges[&active[(slots[at] % active.len() as u64) as usize]],
                };
                let segment_id = range.active_segment_id().expect("routed ranges are active");
                by_range
                    .entry(range.range_id)
                    .or_insert_with(|| RangeBatch {
                        key: SegmentKey { topic_id, range_id: range.range_id, segment_id },
                        indexes: Vec::new(),
                    })
                    .indexes
                    .push(at);
            }
            Ok(by_range.into_values().collect())
        })
    }

    /// Load accounting and the size-based roll check after a durable append; `active_bytes` is
    /// the segment's size now.
    pub(crate) fn after_append(
        &self,
        key: SegmentKey,
        records: u64,
        bytes: u64,
        active_bytes: u64,
    ) {
        let now_ms = self.clock.now_ms();
        self.coordination.record_load(key, records, bytes, now_ms);
        let due = self.read_meta(key.topic_id, |meta| {
            meta.roll_due(key.topic_id, key.range_id, active_bytes, now_ms, &self.roll_defaults())
        });
        if due {
            self.coordination.request_roll(key.topic_id, key.range_id);
        }
    }

    pub(crate) fn roll_defaults(&self) -> malachi_meta::SegmentRollDefaults {
        malachi_meta::SegmentRollDefaults {
            max_bytes: self.config.segment_max_bytes,
            max_age_ms: self.config.segment_max_age_ms,
        }
    }

    /// A segment whose write or sync failed: reopen it (recovery keeps exactly what reached the
    /// disk), seal it there and roll, so the range takes writes again on a new segment.
    pub(crate) fn repair_poisoned(&self, key: SegmentKey, segment: &Arc<malachi_log::Segment>) {
        self.data.evict_poisoned(key, segment);
        self.coordination.request_roll(key.topic_id, key.range_id);
    }
}

fn too_many(count: usize) -> malachi_log::LimitError {
    malachi_log::LimitError::TooManyRecords { count: count as u64, max: u32::MAX }
}
