//! Histories generated from a simple sequential model of a log must pass; the same histories,
//! mutated in one way, must report the matching violation.
//!
//! The model: each topic is one vector. A produce takes effect when it completes: `Ok` appends
//! its records, `Fail` does not, `Info` appends them or not. A producer has one produce in flight
//! and may retry one whose outcome was unknown. A fetch returns the next page after its reader's
//! position; a group's committed position only grows, except across a rewind; the final drain
//! returns each whole vector.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::history::{
    Commit, Drain, Event, EventKind, Fetch, GroupRead, History, Op, OpId, Produce, ReadRecord,
    Rewind, WrittenRecord,
};
use crate::report::CheckReport;

const PRODUCERS: usize = 3;
const READERS: usize = 2;
const TOPICS: usize = 2;
const GROUPS: usize = 2;
/// Key index `KEYS` means "no key".
const KEYS: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    Fail,
    InfoApplied,
    InfoLost,
}

#[derive(Clone, Debug)]
enum Step {
    Produce { producer: usize, topic: usize, key: usize, count: usize },
    Complete { producer: usize, outcome: Outcome },
    Retry { producer: usize },
    Fetch { reader: usize, topic: usize, page: usize, restart: bool },
    Commit { group: usize, advance: u64 },
    GroupRead { group: usize },
    Rewind { group: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        4 => Just(Outcome::Ok),
        1 => Just(Outcome::Fail),
        1 => Just(Outcome::InfoApplied),
        1 => Just(Outcome::InfoLost),
    ];
    let produce = (0..PRODUCERS, 0..TOPICS, 0..=KEYS, 1..4usize)
        .prop_map(|(producer, topic, key, count)| Step::Produce { producer, topic, key, count });
    let complete = (0..PRODUCERS, outcome)
        .prop_map(|(producer, outcome)| Step::Complete { producer, outcome });
    let fetch = (0..READERS, 0..TOPICS, 0..4usize, prop::bool::weighted(0.1))
        .prop_map(|(reader, topic, page, restart)| Step::Fetch { reader, topic, page, restart });
    prop_oneof![
        4 => produce,
        4 => complete,
        1 => (0..PRODUCERS).prop_map(|producer| Step::Retry { producer }),
        3 => fetch,
        1 => (0..GROUPS, 0..3u64).prop_map(|(group, advance)| Step::Commit { group, advance }),
        1 => (0..GROUPS).prop_map(|group| Step::GroupRead { group }),
        1 => (0..GROUPS).prop_map(|group| Step::Rewind { group }),
    ]
}

#[derive(Clone)]
struct InFlight {
    op_id: OpId,
    topic: usize,
    records: Vec<WrittenRecord>,
}

#[derive(Default)]
struct ProducerState {
    next_sequence: u64,
    in_flight: Option<InFlight>,
    /// The last produce whose outcome was unknown, if not yet retried.
    retryable: Option<InFlight>,
}

/// What the model knows about a value, for choosing mutations.
struct ValueFacts {
    invoked_at: u64,
    acked_at: Option<u64>,
    attempts: u32,
}

struct Model {
    history: History,
    logs: Vec<Vec<ReadRecord>>,
    next_value: u64,
    producers: Vec<ProducerState>,
    /// Per reader and topic: the position and cursor after the last fetch.
    cursors: BTreeMap<(usize, usize), (usize, String)>,
    committed: Vec<u64>,
    facts: BTreeMap<Vec<u8>, ValueFacts>,
}

impl Model {
    fn new() -> Model {
        Model {
            history: History::new(),
            logs: vec![Vec::new(); TOPICS],
            next_value: 0,
            producers: (0..PRODUCERS).map(|_| ProducerState::default()).collect(),
            cursors: BTreeMap::new(),
            committed: vec![0; GROUPS],
            facts: BTreeMap::new(),
        }
    }

    /// Runs `steps` after a fixed prefix (two acknowledged records of one key and producer, one
    /// after the other, so every mutation has something to work on), then drains every topic.
    fn run(steps: &[Step]) -> Model {
        let mut model = Model::new();
        for _ in 0..2 {
            model.apply(&Step::Produce { producer: 0, topic: 0, key: 0, count: 1 });
            model.apply(&Step::Complete { producer: 0, outcome: Outcome::Ok });
        }
        steps.iter().for_each(|step| model.apply(step));
        for producer in 0..PRODUCERS {
            model.apply(&Step::Complete { producer, outcome: Outcome::Ok });
        }
        for topic in 0..TOPICS {
            let drain = Drain { topic: topic_name(topic), records: Vec::new(), skipped: 0 };
            let op_id = model.history.invoke(300, Op::Drain(drain.clone()));
            let records = model.logs[topic].clone();
            model.history.ok_with(op_id, Op::Drain(Drain { records, ..drain }));
        }
        model
    }

    fn now(&self) -> u64 {
        self.history.events().len() as u64
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Produce { producer, topic, key, count } => {
                self.produce(producer, topic, key, count)
            }
            Step::Complete { producer, outcome } => self.complete(producer, outcome),
            Step::Retry { producer } => self.retry(producer),
            Step::Fetch { reader, topic, page, restart } => {
                self.fetch(reader, topic, page, restart)
            }
            Step::Commit { group, advance } => self.commit(group, advance),
            Step::GroupRead { group } => self.group_read(group),
            Step::Rewind { group } => self.rewind(group),
        }
    }

    fn produce(&mut self, producer: usize, topic: usize, key: usize, count: usize) {
        if self.producers[producer].in_flight.is_some() {
            return;
        }
        let mut records = Vec::new();
        for _ in 0..count {
            let value = format!("v{}", self.next_value).into_bytes();
            self.next_value += 1;
            let state = &mut self.producers[producer];
            let key = (key < KEYS).then(|| format!("k{key}").into_bytes());
            let sequence = state.next_sequence;
            state.next_sequence += 1;
            records.push(WrittenRecord { key, value, producer: producer as u64, sequence });
        }
        self.send(producer, topic, records, None);
        self.producers[producer].retryable = None;
    }

    fn send(
        &mut self,
        producer: usize,
        topic: usize,
        records: Vec<WrittenRecord>,
        retry_of: Option<OpId>,
    ) {
        for record in &records {
            let facts = ValueFacts { invoked_at: self.now(), acked_at: None, attempts: 0 };
            self.facts.entry(record.value.clone()).or_insert(facts).attempts += 1;
        }
        let produce = Produce { topic: topic_name(topic), records: records.clone(), retry_of };
        let op_id = self.history.invoke(producer as u64, Op::Produce(produce));
        self.producers[producer].in_flight = Some(InFlight { op_id, topic, records });
    }

    fn complete(&mut self, producer: usize, outcome: Outcome) {
        let Some(in_flight) = self.producers[producer].in_flight.take() else { return };
        let now = self.now();
        match outcome {
            Outcome::Ok => {
                for record in &in_flight.records {
                    let facts = self.facts.get_mut(&record.value).expect("sent values have facts");
                    facts.acked_at = Some(facts.acked_at.unwrap_or(now));
                }
                self.append(&in_flight);
                self.history.ok(in_flight.op_id);
            }
            Outcome::Fail => self.history.fail(in_flight.op_id),
            Outcome::InfoApplied | Outcome::InfoLost => {
                if let Outcome::InfoApplied = outcome {
                    self.append(&in_flight);
                }
                self.history.info(in_flight.op_id);
                self.producers[producer].retryable = Some(in_flight);
            }
        }
    }

    fn append(&mut self, in_flight: &InFlight) {
        let records = in_flight.records.iter();
        let log = &mut self.logs[in_flight.topic];
        log.extend(
            records
                .map(|record| ReadRecord { key: record.key.clone(), value: record.value.clone() }),
        );
    }

    fn retry(&mut self, producer: usize) {
        let state = &mut self.producers[producer];
        if state.in_flight.is_some() {
            return;
        }
        let Some(unknown) = state.retryable.take() else { return };
        self.send(producer, unknown.topic, unknown.records, Some(unknown.op_id));
    }

    fn fetch(&mut self, reader: usize, topic: usize, page: usize, restart: bool) {
        let resumed = self.cursors.get(&(reader, topic)).filter(|_| !restart);
        let (start, cursor_in) = match resumed {
            Some((position, cursor)) => (*position, Some(cursor.clone())),
            None => (0, None),
        };
        let log = &self.logs[topic];
        let end = (start + page).min(log.len());
        let cursor_out = format!("r{reader}t{topic}p{end}");
        let request = Fetch {
            topic: topic_name(topic),
            reader: reader as u64,
            cursor_in,
            records: Vec::new(),
            cursor_out: String::new(),
            skipped: 0,
        };
        let observed = Fetch {
            records: log[start..end].to_vec(),
            cursor_out: cursor_out.clone(),
            ..request.clone()
        };
        let op_id = self.history.invoke(100 + reader as u64, Op::Fetch(request));
        self.history.ok_with(op_id, Op::Fetch(observed));
        self.cursors.insert((reader, topic), (end, cursor_out));
    }

    fn commit(&mut self, group: usize, advance: u64) {
        let length = self.logs[0].len() as u64;
        self.committed[group] = (self.committed[group] + advance).min(length);
        let cursor = format!("g{group}p{}", self.committed[group]);
        let commit = Commit { topic: topic_name(0), group: group_name(group), cursor };
        let op_id = self.history.invoke(200 + group as u64, Op::Commit(commit));
        self.history.ok(op_id);
    }

    fn group_read(&mut self, group: usize) {
        let request =
            GroupRead { topic: topic_name(0), group: group_name(group), position: Vec::new() };
        let observed = GroupRead { position: vec![(0, self.committed[group])], ..request.clone() };
        let op_id = self.history.invoke(200 + group as u64, Op::GroupRead(request));
        self.history.ok_with(op_id, Op::GroupRead(observed));
    }

    fn rewind(&mut self, group: usize) {
        self.committed[group] = 0;
        let rewind = Rewind { topic: topic_name(0), group: group_name(group) };
        let op_id = self.history.invoke(200 + group as u64, Op::Rewind(rewind));
        self.history.ok(op_id);
    }
}

fn topic_name(topic: usize) -> String {
    format!("t{topic}")
}

fn group_name(group: usize) -> String {
    format!("g{group}")
}

/// How a valid history is broken.
#[derive(Clone, Copy, Debug)]
enum Mutation {
    /// Remove every copy of an acknowledged record from topic 0's drain.
    DropAcked,
    /// Swap two records of one key in topic 0's drain, the first acknowledged before the
    /// second was sent.
    SwapSameKey,
    /// Insert a second copy of a record sent by one attempt into topic 0's drain.
    DuplicateValue,
}

impl Mutation {
    fn expected(self) -> &'static str {
        match self {
            Mutation::DropAcked => "LostWrite",
            Mutation::SwapSameKey => "KeyOrderViolation",
            Mutation::DuplicateValue => "DuplicateRead",
        }
    }
}

/// Applies `mutation` to the model's history, choosing with `choice`.
fn mutate(model: Model, mutation: Mutation, choice: usize) -> History {
    let facts = &model.facts;
    let mut events = model.history.into_events();
    let drain = events
        .iter_mut()
        .rev()
        .find_map(|event| match &mut event.op {
            Op::Drain(drain) if event.kind == EventKind::Ok && drain.topic == topic_name(0) => {
                Some(drain)
            }
            _ => None,
        })
        .expect("the model drains topic 0");
    let records = &mut drain.records;
    match mutation {
        Mutation::DropAcked => {
            let acked: Vec<Vec<u8>> = records
                .iter()
                .filter(|record| facts[&record.value].acked_at.is_some())
                .map(|record| record.value.clone())
                .collect();
            let victim = acked[choice % acked.len()].clone();
            records.retain(|record| record.value != victim);
        }
        Mutation::SwapSameKey => {
            let pairs = inverted_pairs(records, facts);
            let (first, second) = pairs[choice % pairs.len()];
            records.swap(first, second);
        }
        Mutation::DuplicateValue => {
            let single: Vec<usize> =
                (0..records.len()).filter(|&at| facts[&records[at].value].attempts == 1).collect();
            let copy = records[single[choice % single.len()]].clone();
            let at = choice / 7 % (records.len() + 1);
            records.insert(at, copy);
        }
    }
    History::from_events(events)
}

/// Positions (i, j), i < j, of first copies with one key where record i was acknowledged
/// before record j was sent: swapping them must be a key order violation.
fn inverted_pairs(
    records: &[ReadRecord],
    facts: &BTreeMap<Vec<u8>, ValueFacts>,
) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for first in 0..records.len() {
        let a = &records[first];
        let a_first_copy = records[..first].iter().all(|record| record.value != a.value);
        let Some(acked_at) = facts[&a.value].acked_at.filter(|_| a.key.is_some() && a_first_copy)
        else {
            continue;
        };
        for (second, b) in records.iter().enumerate().skip(first + 1) {
            if b.key == a.key && acked_at < facts[&b.value].invoked_at {
                pairs.push((first, second));
            }
        }
    }
    pairs
}

fn assert_clean(report: &CheckReport, model_acked: usize) {
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.stats.records_acked, model_acked as u64, "{report}");
    assert_eq!(report.stats.expired_by_retention, 0);
}

proptest! {
    #[test]
    fn model_histories_pass(steps in prop::collection::vec(step(), 0..120)) {
        let model = Model::run(&steps);
        let acked = model.facts.values().filter(|facts| facts.acked_at.is_some()).count();
        assert_clean(&model.history.check(), acked);
    }

    #[test]
    fn mutated_histories_report_the_matching_violation(
        steps in prop::collection::vec(step(), 0..120),
        mutation in prop_oneof![
            Just(Mutation::DropAcked),
            Just(Mutation::SwapSameKey),
            Just(Mutation::DuplicateValue),
        ],
        choice in any::<usize>(),
    ) {
        let history = mutate(Model::run(&steps), mutation, choice);
        let report = history.check();
        let names = report.violation_names();
        prop_assert!(names.contains(&mutation.expected()), "{mutation:?}:\n{report}");
    }
}

/// A deterministic step stream (xorshift), for the large history.
fn step_stream(count: usize) -> Vec<Step> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let outcomes = [
        Outcome::Ok,
        Outcome::Ok,
        Outcome::Ok,
        Outcome::Fail,
        Outcome::InfoApplied,
        Outcome::InfoLost,
    ];
    (0..count)
        .map(|_| match next(8) {
            0..=2 => Step::Produce {
                producer: next(PRODUCERS),
                topic: next(TOPICS),
                key: next(KEYS + 1),
                count: 1 + next(3),
            },
            3..=4 => Step::Complete {
                producer: next(PRODUCERS),
                outcome: outcomes[next(outcomes.len())],
            },
            5 => Step::Retry { producer: next(PRODUCERS) },
            6 => Step::Fetch {
                reader: next(READERS),
                topic: next(TOPICS),
                page: 1 + next(8),
                restart: next(50) == 0,
            },
            _ => match next(3) {
                0 => Step::Commit { group: next(GROUPS), advance: next(4) as u64 },
                1 => Step::GroupRead { group: next(GROUPS) },
                _ => Step::Rewind { group: next(GROUPS) },
            },
        })
        .collect()
}

#[test]
fn a_hundred_thousand_events_pass_and_their_mutations_fail() {
    let model = Model::run(&step_stream(130_000));
    let events = model.history.events().len();
    assert!(events >= 100_000, "only {events} events");
    let acked = model.facts.values().filter(|facts| facts.acked_at.is_some()).count();
    let report = model.history.check();
    assert_clean(&report, acked);
    // The stream exercises every path, or this test proves less than it claims.
    let stats = &report.stats;
    assert!(stats.produces_failed > 0 && stats.produces_unknown > 0, "{report}");
    assert!(stats.retried_duplicates > 0 && stats.cursor_chains > 1, "{report}");
    assert!(stats.group_reads_ok > 0, "{report}");

    let undeclared: Vec<Event> = (model.history.events().iter())
        .filter(|event| !matches!(event.op, Op::Rewind(_)))
        .cloned()
        .collect();
    let report = History::from_events(undeclared).check();
    assert_eq!(report.violation_names(), ["GroupRegression"], "{report}");

    let report = mutate(model, Mutation::DropAcked, 12_345).check();
    assert_eq!(report.violation_names(), ["LostWrite"], "{report}");
}
