//! What a check finds: named violations with the op ids and values a reader of a failing seed
//! needs, counters, and a short human summary.
//!
//! Violations are sorted (by kind in declaration order, then by their fields) and deduplicated, so
//! the same history always yields the same report, byte for byte, and the simulator can hash it.
//! Their number is bounded by the history's size: each record a read returns yields at most a
//! constant number of them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::OpId;

/// How many violations [`CheckReport`]'s `Display` prints in full.
pub const DISPLAY_VIOLATIONS_MAX: usize = 10;

/// The verdict on one history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckReport {
    pub violations: Vec<Violation>,
    pub stats: Stats,
}

/// One broken promise. The first seven are the system's; the last three are the workload's
/// (see [`Violation::is_workload_bug`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Violation {
    /// An acknowledged record is absent from its topic's final drain, and the drain skipped too
    /// few records for retention to explain the absences.
    LostWrite {
        topic: String,
        value: Vec<u8>,
        key: Option<Vec<u8>>,
        acked_by: OpId,
        drain: OpId,
        drain_skipped: u64,
    },
    /// A read returned a value no produce ever sent.
    PhantomRead { topic: String, read: OpId, value: Vec<u8> },
    /// One fetch or one drain returned a value more often than its produce attempts that may
    /// have happened allow.
    DuplicateRead { read: OpId, value: Vec<u8>, copies: u32, copies_allowed: u32 },
    /// `later` was invoked after `earlier` was acknowledged, yet a read returned `later` first.
    KeyOrderViolation {
        key: Vec<u8>,
        earlier: Vec<u8>,
        earlier_acked_by: OpId,
        earlier_acked_at: u64,
        later: Vec<u8>,
        later_invoked_by: OpId,
        later_invoked_at: u64,
        site: ReadSite,
    },
    /// Two acknowledged records of one producer and key came back with the higher sequence
    /// number first.
    ProducerOrderViolation {
        producer: u64,
        key: Vec<u8>,
        lower_sequence: u64,
        lower: Vec<u8>,
        higher_sequence: u64,
        higher: Vec<u8>,
        site: ReadSite,
    },
    /// A fetch of a cursor chain returned a value an earlier fetch of the same chain returned:
    /// the cursor moved backwards.
    CursorRegression {
        reader: u64,
        topic: String,
        value: Vec<u8>,
        first_fetch: OpId,
        again_fetch: OpId,
    },
    /// A group read completed before another was invoked, saw a higher position, and no rewind
    /// of the group could have happened between them.
    GroupRegression {
        topic: String,
        group: String,
        range: u32,
        earlier_read: OpId,
        earlier_position: u64,
        later_read: OpId,
        later_position: u64,
    },
    /// A read returned a value whose every produce attempt definitely failed.
    ReadOfFailedWrite { read: OpId, value: Vec<u8>, produce: OpId },
    /// A read returned a written value under another topic or key than it was written with.
    MismatchedRead {
        read: OpId,
        value: Vec<u8>,
        written_topic: String,
        written_key: Option<Vec<u8>>,
        read_topic: String,
        read_key: Option<Vec<u8>>,
    },
    /// Workload bug: two produces that are not retries of each other sent the same value (or a
    /// retry re-sent a value with another key, producer, sequence or topic).
    DuplicateWrite { value: Vec<u8>, first_produce: OpId, second_produce: OpId },
    /// Workload bug: a topic has acknowledged records but no successful drain, so nothing can
    /// be said about lost writes.
    MissingDrain { topic: String, records_acked: u64 },
    /// Workload bug: an event that does not fit the history's shape (ignored by the checks).
    MalformedEvent { event: u64, op_id: OpId, reason: String },
}

/// Where two records were returned in the wrong order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReadSite {
    /// Both came from one drain.
    Drain { drain: OpId },
    /// Both came from one reader's cursor chain; the fetches that returned each, in read order
    /// (equal when one fetch returned both).
    Chain { reader: u64, first_fetch: OpId, second_fetch: OpId },
}

/// Counters; they never decide the verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stats {
    pub events: u64,
    /// Produce attempts (retries included) by outcome; unknown counts `Info` and no completion.
    pub produces_ok: u64,
    pub produces_failed: u64,
    pub produces_unknown: u64,
    /// Distinct values sent by produce invokes.
    pub records_written: u64,
    /// Distinct values at least one `Ok` produce attempt carried.
    pub records_acked: u64,
    pub fetches_ok: u64,
    /// Cursor chains started (fetches that continue no earlier fetch).
    pub cursor_chains: u64,
    /// Records returned by successful fetches, every copy counted.
    pub records_read: u64,
    /// Records returned by successful drains, every copy counted.
    pub records_drained: u64,
    pub group_reads_ok: u64,
    /// Distinct values some read returned more than once, within what their retries allow.
    pub retried_duplicates: u64,
    /// Acknowledged records absent from a final drain that retention explains.
    pub expired_by_retention: u64,
}

impl CheckReport {
    /// Sorts and deduplicates `violations`, which makes the report canonical.
    pub fn new(mut violations: Vec<Violation>, stats: Stats) -> CheckReport {
        violations.sort();
        violations.dedup();
        CheckReport { violations, stats }
    }

    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The distinct violation names, in declaration order.
    pub fn violation_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.violations.iter().map(Violation::name).collect();
        names.dedup();
        names
    }
}

impl Violation {
    pub fn name(&self) -> &'static str {
        match self {
            Violation::LostWrite { .. } => "LostWrite",
            Violation::PhantomRead { .. } => "PhantomRead",
            Violation::DuplicateRead { .. } => "DuplicateRead",
            Violation::KeyOrderViolation { .. } => "KeyOrderViolation",
            Violation::ProducerOrderViolation { .. } => "ProducerOrderViolation",
            Violation::CursorRegression { .. } => "CursorRegression",
            Violation::GroupRegression { .. } => "GroupRegression",
            Violation::ReadOfFailedWrite { .. } => "ReadOfFailedWrite",
            Violation::MismatchedRead { .. } => "MismatchedRead",
            Violation::DuplicateWrite { .. } => "DuplicateWrite",
            Violation::MissingDrain { .. } => "MissingDrain",
            Violation::MalformedEvent { .. } => "MalformedEvent",
        }
    }

    /// True when the history, not the system, is at fault.
    pub fn is_workload_bug(&self) -> bool {
        matches!(
            self,
            Violation::DuplicateWrite { .. }
                | Violation::MissingDrain { .. }
                | Violation::MalformedEvent { .. }
        )
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            writeln!(formatter, "history check passed")?;
        } else {
            write!(formatter, "history check FAILED: {} violations (", self.violations.len())?;
            let mut names = self.violation_names().into_iter().peekable();
            while let Some(name) = names.next() {
                let count = self.violations.iter().filter(|v| v.name() == name).count();
                let separator = if names.peek().is_some() { ", " } else { "" };
                write!(formatter, "{name} {count}{separator}")?;
            }
            writeln!(formatter, ")")?;
        }
        write!(formatter, "{}", self.stats)?;
        for violation in self.violations.iter().take(DISPLAY_VIOLATIONS_MAX) {
            writeln!(formatter, "  {violation}")?;
        }
        let hidden = self.violations.len().saturating_sub(DISPLAY_VIOLATIONS_MAX);
        if hidden > 0 {
            writeln!(formatter, "  ... and {hidden} more")?;
        }
        Ok(())
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self;
        writeln!(
            formatter,
            "  {} events; produces ok/failed/unknown {}/{}/{}; records written {}, acked {}",
            s.events,
            s.produces_ok,
            s.produces_failed,
            s.produces_unknown,
            s.records_written,
            s.records_acked
        )?;
        writeln!(
            formatter,
            "  fetches {} in {} chains, records read {}, drained {}; group reads {}",
            s.fetches_ok, s.cursor_chains, s.records_read, s.records_drained, s.group_reads_ok
        )?;
        writeln!(
            formatter,
            "  retried duplicates {}, expired by retention {}",
            s.retried_duplicates, s.expired_by_retention
        )
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: ", self.name())?;
        match self {
            Violation::LostWrite { topic, value, key, acked_by, drain, drain_skipped } => write!(
                formatter,
                "{} (key {}) acked by op {acked_by} is missing from drain op {drain} of topic \
                 {topic:?}, which skipped only {drain_skipped}",
                Bytes(value),
                OptionalBytes(key)
            ),
            Violation::PhantomRead { topic, read, value } => write!(
                formatter,
                "op {read} on topic {topic:?} returned {}, which no produce sent",
                Bytes(value)
            ),
            Violation::DuplicateRead { read, value, copies, copies_allowed } => write!(
                formatter,
                "op {read} returned {} {copies} times; its produce attempts allow {copies_allowed}",
                Bytes(value)
            ),
            Violation::KeyOrderViolation { .. } => self.fmt_key_order(formatter),
            Violation::ProducerOrderViolation { .. } => self.fmt_producer_order(formatter),
            _ => self.fmt_other(formatter),
        }
    }
}

impl Violation {
    fn fmt_key_order(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Violation::KeyOrderViolation {
            key,
            earlier,
            earlier_acked_by,
            earlier_acked_at,
            later,
            later_invoked_by,
            later_invoked_at,
            site,
        } = self
        else {
            unreachable!("called on a key order violation only");
        };
        write!(
            formatter,
            "key {}: {} (produce op {later_invoked_by} invoked at event {later_invoked_at}) came \
             before {} (acked by op {earlier_acked_by} at event {earlier_acked_at}) in {site}",
            Bytes(key),
            Bytes(later),
            Bytes(earlier)
        )
    }

    fn fmt_producer_order(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Violation::ProducerOrderViolation {
            producer,
            key,
            lower_sequence,
            lower,
            higher_sequence,
            higher,
            site,
        } = self
        else {
            unreachable!("called on a producer order violation only");
        };
        write!(
            formatter,
            "producer {producer}, key {}: sequence {higher_sequence} ({}) came before sequence \
             {lower_sequence} ({}) in {site}",
            Bytes(key),
            Bytes(higher),
            Bytes(lower)
        )
    }

    fn fmt_other(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::CursorRegression { reader, topic, value, first_fetch, again_fetch } => {
                write!(
                    formatter,
                    "reader {reader} on topic {topic:?}: fetch op {again_fetch} returned {} \
                     again (first returned by fetch op {first_fetch} of the same chain)",
                    Bytes(value)
                )
            }
            Violation::GroupRegression {
                topic,
                group,
                range,
                earlier_read,
                earlier_position,
                later_read,
                later_position,
            } => write!(
                formatter,
                "group {group:?} of topic {topic:?}, range {range}: op {earlier_read} saw \
                 {earlier_position}, then op {later_read} saw {later_position}, with no rewind"
            ),
            Violation::ReadOfFailedWrite { read, value, produce } => write!(
                formatter,
                "op {read} returned {}, whose produce op {produce} failed definitely",
                Bytes(value)
            ),
            Violation::MismatchedRead { .. } => self.fmt_mismatched(formatter),
            Violation::DuplicateWrite { value, first_produce, second_produce } => write!(
                formatter,
                "{} sent by produce op {first_produce} and again by op {second_produce}, which \
                 is not its retry (workload bug)",
                Bytes(value)
            ),
            Violation::MissingDrain { topic, records_acked } => write!(
                formatter,
                "topic {topic:?} has {records_acked} acked records but no successful drain \
                 (workload bug)"
            ),
            Violation::MalformedEvent { event, op_id, reason } => {
                write!(formatter, "event {event} (op {op_id}): {reason} (workload bug)")
            }
            _ => unreachable!("the other kinds are formatted by Display"),
        }
    }

    fn fmt_mismatched(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Violation::MismatchedRead {
            read,
            value,
            written_topic,
            written_key,
            read_topic,
            read_key,
        } = self
        else {
            unreachable!("called on a mismatched read only");
        };
        write!(
            formatter,
            "op {read} returned {} as topic {read_topic:?} key {}; it was written to topic \
             {written_topic:?} key {}",
            Bytes(value),
            OptionalBytes(read_key),
            OptionalBytes(written_key)
        )
    }
}

impl fmt::Display for ReadSite {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadSite::Drain { drain } => write!(formatter, "drain op {drain}"),
            ReadSite::Chain { reader, first_fetch, second_fetch }
                if first_fetch == second_fetch =>
            {
                write!(formatter, "fetch op {first_fetch} of reader {reader}")
            }
            ReadSite::Chain { reader, first_fetch, second_fetch } => write!(
                formatter,
                "reader {reader}'s cursor chain (fetch op {first_fetch}, then fetch op \
                 {second_fetch})"
            ),
        }
    }
}

/// Shows a value or key as a quoted string when it is printable text, else as hex.
struct Bytes<'a>(&'a [u8]);

struct OptionalBytes<'a>(&'a Option<Vec<u8>>);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(self.0) {
            Ok(text) if !text.chars().any(char::is_control) => write!(formatter, "{text:?}"),
            _ => {
                write!(formatter, "0x")?;
                self.0.iter().try_for_each(|byte| write!(formatter, "{byte:02x}"))
            }
        }
    }
}

impl fmt::Display for OptionalBytes<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(bytes) => write!(formatter, "{}", Bytes(bytes)),
            None => write!(formatter, "none"),
        }
    }
}
