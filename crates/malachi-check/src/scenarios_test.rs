//! Hand-written histories, one per behaviour, each with the exact violation names it must yield.

use crate::history::{Event, EventKind, History, ReadRecord, WrittenRecord};
use crate::report::{ReadSite, Violation};
use crate::testkit::*;

struct Case {
    name: &'static str,
    build: fn() -> History,
    expected: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case { name: "clean", build: clean, expected: &[] },
    Case { name: "lost write", build: lost_write, expected: &["LostWrite"] },
    Case { name: "phantom read", build: phantom_read, expected: &["PhantomRead"] },
    Case { name: "duplicate in drain", build: duplicate_in_drain, expected: &["DuplicateRead"] },
    Case { name: "duplicate in fetch", build: duplicate_in_fetch, expected: &["DuplicateRead"] },
    Case {
        name: "key order in drain",
        build: key_order_in_drain,
        expected: &["KeyOrderViolation"],
    },
    Case {
        name: "key order in chain",
        build: key_order_in_chain,
        expected: &["KeyOrderViolation"],
    },
    Case {
        name: "key order, later write unknown",
        build: key_order_later_unknown,
        expected: &["KeyOrderViolation"],
    },
    Case {
        name: "producer order, pipelined",
        build: producer_order_pipelined,
        expected: &["ProducerOrderViolation"],
    },
    Case { name: "cursor regression", build: cursor_regression, expected: &["CursorRegression"] },
    Case { name: "group regression", build: group_regression, expected: &["GroupRegression"] },
    Case { name: "group rewind declared", build: group_rewind_declared, expected: &[] },
    Case { name: "group rewind unknown outcome", build: group_rewind_unknown, expected: &[] },
    Case {
        name: "group rewind before both reads",
        build: group_rewind_before_both,
        expected: &["GroupRegression"],
    },
    Case { name: "group reads concurrent", build: group_reads_concurrent, expected: &[] },
    Case { name: "retried duplicate in drain", build: retried_duplicate, expected: &[] },
    Case { name: "retried duplicate in chain", build: retried_duplicate_in_chain, expected: &[] },
    Case {
        name: "retry, too many copies",
        build: retry_too_many_copies,
        expected: &["DuplicateRead"],
    },
    Case { name: "late retry copy first in chain", build: late_copy_in_chain, expected: &[] },
    Case {
        name: "late retry copy first in full drain",
        build: late_copy_in_drain,
        expected: &["ProducerOrderViolation"],
    },
    Case { name: "retention explains missing", build: retention_explains, expected: &[] },
    Case { name: "retention too small", build: retention_too_small, expected: &["LostWrite"] },
    Case { name: "concurrent same key", build: concurrent_same_key, expected: &[] },
    Case { name: "keyless any order", build: keyless_any_order, expected: &[] },
    Case { name: "unknown write missing", build: unknown_write_missing, expected: &[] },
    Case { name: "chain fork", build: chain_fork, expected: &[] },
    Case { name: "last drain is final", build: last_drain_is_final, expected: &[] },
    Case { name: "duplicate write", build: duplicate_write, expected: &["DuplicateWrite"] },
    Case {
        name: "read of failed write",
        build: read_of_failed_write,
        expected: &["ReadOfFailedWrite"],
    },
    Case { name: "mismatched key", build: mismatched_key, expected: &["MismatchedRead"] },
    Case { name: "missing drain", build: missing_drain, expected: &["MissingDrain"] },
    Case {
        name: "malformed completion",
        build: malformed_completion,
        expected: &["MalformedEvent"],
    },
];

#[test]
fn each_case_reports_exactly_its_violations() {
    for case in CASES {
        let report = (case.build)().check();
        assert_eq!(report.violation_names(), case.expected, "case {:?}:\n{report}", case.name);
    }
}

fn clean() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    produced(&mut history, 1, &["v2"]);
    fetched(&mut history, 1, None, &["v1"], "c1");
    fetched(&mut history, 1, Some("c1"), &["v2"], "c2");
    group_read(&mut history, 1);
    group_read(&mut history, 2);
    drained(&mut history, &["v1", "v2"], 0);
    history
}

fn lost_write() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1", "v2"]);
    drained(&mut history, &["v1"], 0);
    history
}

fn phantom_read() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    fetched(&mut history, 1, None, &["v1", "ghost"], "c1");
    drained(&mut history, &["v1"], 0);
    history
}

fn duplicate_in_drain() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    drained(&mut history, &["v1", "v1"], 0);
    history
}

fn duplicate_in_fetch() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    fetched(&mut history, 1, None, &["v1", "v1"], "c1");
    drained(&mut history, &["v1"], 0);
    history
}

/// v1 is acknowledged before v2 is sent (by another producer), but the drain returns v2 first.
fn key_order_in_drain() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    produced(&mut history, 2, &["v2"]);
    drained(&mut history, &["v2", "v1"], 0);
    history
}

/// The same inversion, split over two fetches of one chain; the drain is right.
fn key_order_in_chain() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    produced(&mut history, 2, &["v2"]);
    fetched(&mut history, 1, None, &["v2"], "c1");
    fetched(&mut history, 1, Some("c1"), &["v1"], "c2");
    drained(&mut history, &["v1", "v2"], 0);
    history
}

/// v2's outcome is unknown, but it was sent after v1's ack, so it cannot precede v1.
fn key_order_later_unknown() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    let unknown = invoke_produce(&mut history, 2, &["v2"]);
    history.info(unknown);
    drained(&mut history, &["v2", "v1"], 0);
    history
}

/// Producer 1 pipelines sequences 0 and 1; both are acknowledged, concurrently, so real time
/// says nothing, but sequence order still binds.
fn producer_order_pipelined() -> History {
    let mut history = History::new();
    let first = history.invoke(1, produce(vec![written("k", "v1", 1, 0)], None));
    let second = history.invoke(1, produce(vec![written("k", "v2", 1, 1)], None));
    history.ok(first);
    history.ok(second);
    drained(&mut history, &["v2", "v1"], 0);
    history
}

fn cursor_regression() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1", "v2"]);
    fetched(&mut history, 1, None, &["v1", "v2"], "c2");
    fetched(&mut history, 1, Some("c2"), &["v2"], "c3");
    drained(&mut history, &["v1", "v2"], 0);
    history
}

fn group_regression() -> History {
    let mut history = History::new();
    group_read(&mut history, 5);
    group_read(&mut history, 3);
    history
}

fn group_rewind_declared() -> History {
    let mut history = History::new();
    group_read(&mut history, 5);
    let rewind = history.invoke(200, rewind_op());
    history.ok(rewind);
    group_read(&mut history, 0);
    history
}

fn group_rewind_unknown() -> History {
    let mut history = History::new();
    let rewind = history.invoke(201, rewind_op());
    history.info(rewind);
    group_read(&mut history, 5);
    group_read(&mut history, 0);
    history
}

/// A rewind that completed before the first read cannot explain a regression between reads.
fn group_rewind_before_both() -> History {
    let mut history = History::new();
    let rewind = history.invoke(200, rewind_op());
    history.ok(rewind);
    group_read(&mut history, 5);
    group_read(&mut history, 3);
    history
}

fn group_reads_concurrent() -> History {
    let mut history = History::new();
    let first = invoke_group_read(&mut history);
    let second = history.invoke(201, group_read_op(Vec::new()));
    observe_group(&mut history, first, 5);
    history.ok_with(second, group_read_op(vec![(0, 3)]));
    history
}

/// v1's first attempt times out, its retry succeeds, and both attempts landed.
fn retried_duplicate() -> History {
    let mut history = History::new();
    let first = invoke_produce(&mut history, 1, &["v1"]);
    history.info(first);
    let retry = history.invoke(1, produce(vec![written("k", "v1", 1, 0)], Some(first)));
    history.ok(retry);
    drained(&mut history, &["v1", "v1"], 0);
    history
}

fn retried_duplicate_in_chain() -> History {
    let mut history = retried_duplicate();
    fetched(&mut history, 1, None, &["v1"], "c1");
    fetched(&mut history, 1, Some("c1"), &["v1"], "c2");
    history
}

/// One batch of v1, v2 (same producer and key) sent twice, the first outcome unknown; the log
/// holds v1 v2 v1 v2. A reader that starts between the first v1 and v2 (a group member) reads
/// v2 v1 v2: found by the simulator (seed 28), not a violation.
fn late_copy_history() -> History {
    let mut history = History::new();
    let batch = vec![written("k", "v1", 1, 1), written("k", "v2", 1, 2)];
    let first = history.invoke(1, produce(batch.clone(), None));
    history.info(first);
    let retry = history.invoke(1, produce(batch, Some(first)));
    history.ok(retry);
    history
}

fn late_copy_in_chain() -> History {
    let mut history = late_copy_history();
    fetched(&mut history, 1, None, &["v2", "v1", "v2"], "c1");
    drained(&mut history, &["v1", "v2", "v1", "v2"], 0);
    history
}

/// From the log's start the first copies are the real first copies: v2 before v1 is wrong.
fn late_copy_in_drain() -> History {
    let mut history = late_copy_history();
    drained(&mut history, &["v2", "v1", "v2"], 0);
    history
}

fn retry_too_many_copies() -> History {
    let mut history = History::new();
    let first = invoke_produce(&mut history, 1, &["v1"]);
    history.info(first);
    let retry = history.invoke(1, produce(vec![written("k", "v1", 1, 0)], Some(first)));
    history.ok(retry);
    drained(&mut history, &["v1", "v1", "v1"], 0);
    history
}

fn retention_explains() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1", "v2", "v3"]);
    drained(&mut history, &["v3"], 2);
    history
}

fn retention_too_small() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1", "v2", "v3"]);
    drained(&mut history, &["v3"], 1);
    history
}

fn concurrent_same_key() -> History {
    let mut history = History::new();
    let first = invoke_produce(&mut history, 1, &["v1"]);
    let second = invoke_produce(&mut history, 2, &["v2"]);
    history.ok(first);
    history.ok(second);
    drained(&mut history, &["v2", "v1"], 0);
    history
}

fn keyless_any_order() -> History {
    let mut history = History::new();
    for (process, value) in [(1, "v1"), (1, "v2")] {
        let record = WrittenRecord { key: None, ..written("", value, process, 0) };
        let op_id = history.invoke(process, produce(vec![record], None));
        history.ok(op_id);
    }
    let records = ["v2", "v1"].map(|value| ReadRecord { key: None, ..read("", value) });
    let drain = history.invoke(300, drain_op(Vec::new(), 0));
    history.ok_with(drain, drain_op(records.to_vec(), 0));
    history
}

fn unknown_write_missing() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    let unknown = invoke_produce(&mut history, 2, &["v2"]);
    history.info(unknown);
    invoke_produce(&mut history, 3, &["v3"]);
    drained(&mut history, &["v1"], 0);
    history
}

/// Reader 1 resumes twice from cursor c1; each branch is a chain of its own.
fn chain_fork() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1", "v2"]);
    fetched(&mut history, 1, None, &["v1"], "c1");
    fetched(&mut history, 1, Some("c1"), &["v2"], "c2");
    fetched(&mut history, 1, Some("c1"), &["v2"], "c2");
    drained(&mut history, &["v1", "v2"], 0);
    history
}

fn last_drain_is_final() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    drained(&mut history, &["v1"], 0);
    produced(&mut history, 1, &["v2"]);
    drained(&mut history, &["v1", "v2"], 0);
    history
}

fn duplicate_write() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    produced(&mut history, 2, &["v1"]);
    drained(&mut history, &["v1"], 0);
    history
}

fn read_of_failed_write() -> History {
    let mut history = History::new();
    let failed = invoke_produce(&mut history, 1, &["v1"]);
    history.fail(failed);
    drained(&mut history, &["v1"], 0);
    history
}

fn mismatched_key() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    let drain = history.invoke(300, drain_op(Vec::new(), 0));
    history.ok_with(drain, drain_op(vec![read("other", "v1")], 0));
    history
}

fn missing_drain() -> History {
    let mut history = History::new();
    produced(&mut history, 1, &["v1"]);
    history
}

fn malformed_completion() -> History {
    let mut history = History::new();
    let op = drain_op(Vec::new(), 0);
    history.push(Event { process: 9, op_id: 42, kind: EventKind::Ok, op });
    history
}

#[test]
fn retried_duplicates_are_counted_not_reported() {
    let report = retried_duplicate_in_chain().check();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.stats.retried_duplicates, 1);
    assert_eq!(report.stats.produces_unknown, 1);
    assert_eq!(report.stats.produces_ok, 1);
}

#[test]
fn retention_expired_records_are_counted_not_lost() {
    let report = retention_explains().check();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.stats.expired_by_retention, 2);
    assert_eq!(report.stats.records_acked, 3);
}

#[test]
fn lost_write_names_value_op_and_drain() {
    let report = lost_write().check();
    let expected = Violation::LostWrite {
        topic: TOPIC.to_string(),
        value: b"v2".to_vec(),
        key: Some(b"k".to_vec()),
        acked_by: 0,
        drain: 1,
        drain_skipped: 0,
    };
    assert_eq!(report.violations, vec![expected]);
}

#[test]
fn key_order_in_chain_names_both_fetches() {
    let report = key_order_in_chain().check();
    let expected = Violation::KeyOrderViolation {
        key: b"k".to_vec(),
        earlier: b"v1".to_vec(),
        earlier_acked_by: 0,
        earlier_acked_at: 1,
        later: b"v2".to_vec(),
        later_invoked_by: 1,
        later_invoked_at: 2,
        site: ReadSite::Chain { reader: 1, first_fetch: 2, second_fetch: 3 },
    };
    assert_eq!(report.violations, vec![expected]);
}

#[test]
fn display_summarises_by_name() {
    let text = key_order_in_chain().check().to_string();
    let expected = [
        "history check FAILED: 1 violations (KeyOrderViolation 1)",
        "KeyOrderViolation: key \"k\": \"v2\" (produce op 1 invoked at event 2) came before \"v1\"",
        "reader 1's cursor chain (fetch op 2, then fetch op 3)",
    ];
    for line in expected {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    assert!(clean().check().to_string().starts_with("history check passed"));
}

#[test]
fn history_survives_json_and_checks_the_same() {
    for case in CASES {
        let history = (case.build)();
        let json = serde_json::to_string(&history).expect("a history serializes");
        let loaded: History = serde_json::from_str(&json).expect("a history deserializes");
        assert_eq!(loaded, history, "case {:?}", case.name);
        assert_eq!(loaded.check(), history.check(), "case {:?}", case.name);
    }
}

#[test]
fn builder_continues_numbering_after_raw_events() {
    let mut history = History::from_events(lost_write().into_events());
    let next = history.invoke(1, produce(Vec::new(), None));
    assert_eq!(next, 2);
}
