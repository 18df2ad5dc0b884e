//! The coordinator of a vnode: the one place that decides when a range's write head moves (roll,
//! split, merge) and when segments expire. Sans-IO: events come in (leadership, roll requests
//! from the brokers holding the heads, load reports, finished operations, ticks with the
//! metadata and the time), decisions go out, each stamped with the term it was decided in.
//!
//! Only the vnode's leader coordinates. Every decision carries the leader's term, and the
//! driver (`maintenance.rs`, `topics.rs`) proposes its metadata command on this node only, in
//! that term, never forwarded: a node that lost the leadership cannot act on a decision it made
//! while it led, because its proposal cannot commit in a term that is over. The moment this node
//! hears it does not lead, it forgets what it was asked (the new leader hears it again) and
//! decides nothing more.
//!
//! Brokers holding write heads keep the per-range facts that need their disk (a head's size, its
//! age once it holds a record, a failed head, the append rates) and report them to the leader:
//! roll requests and load reports. A range with an operation in flight gets no other decision
//! until the driver reports it finished.

use malachi_log::canary;
use std::collections::{BTreeMap, BTreeSet};

use malachi_meta::{MetaState, PolicyDefinitions, RetentionDefaults, SegmentRef};

use crate::load::{ActiveRange, LoadConfig, Rate, Reshape, plan_reshape};

/// A load report older than this many windows is dropped: its holder stopped reporting.
const REPORT_WINDOWS_KEPT: u64 = 2;

/// What the coordinator needs to know of the configuration.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub load: LoadConfig,
    pub retention_interval_ms: u64,
    pub retention: RetentionDefaults,
}

/// Something the coordinator decided, and the term it was decided in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub term: u64,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Roll { topic_id: u64, range_id: u32 },
    Split { topic_id: u64, range_id: u32 },
    Merge { topic_id: u64, left: u32, right: u32 },
    Expire { segments: Vec<SegmentRef> },
}

impl Action {
    /// The ranges the action moves the heads of (none for an expiry).
    pub fn ranges(&self) -> Vec<(u64, u32)> {
        match *self {
            Action::Roll { topic_id, range_id } | Action::Split { topic_id, range_id } => {
                vec![(topic_id, range_id)]
            }
            Action::Merge { topic_id, left, right } => vec![(topic_id, left), (topic_id, right)],
            Action::Expire { .. } => Vec::new(),
        }
    }
}

#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    /// The term this node leads the vnode in; `None` while it does not.
    term: Option<u64>,
    /// The simulator's canary: keep deciding after losing the leadership, in the last term led.
    canary_deposed: bool,
    /// The last term led, for the canary.
    last_term: u64,
    busy: BTreeSet<(u64, u32)>,
    /// While this node hands the leadership over: nothing new is decided, so that what is in
    /// flight can finish before the new leader starts.
    handing_over: bool,
    /// When each topic was last reshaped (or a reshape of it last failed).
    last_reshape_ms: BTreeMap<u64, u64>,
    /// Each range's rate as each broker that wrote it last reported it, with the time of the
    /// report: `(topic_id, range_id, broker)`. A range's head moves between brokers as it
    /// rolls, so its rate is the sum over the brokers that took its appends in the window.
    rates: BTreeMap<(u64, u32, u64), (Rate, u64)>,
    last_retention_ms: Option<u64>,
}

impl Coordinator {
    pub fn new(config: CoordinatorConfig, canary_deposed: bool) -> Coordinator {
        Coordinator {
            config,
            term: None,
            canary_deposed,
            last_term: 0,
            busy: BTreeSet::new(),
            handing_over: false,
            last_reshape_ms: BTreeMap::new(),
            rates: BTreeMap::new(),
            last_retention_ms: None,
        }
    }

    /// What this node knows of the vnode's leadership: whether it leads, in which term. Losing
    /// the leadership (or a new term) forgets everything asked of the old leader.
    pub fn leadership(&mut self, leads: bool, term: u64) {
        let now = leads.then_some(term);
        if now != self.term {
            self.rates.clear();
            self.last_retention_ms = None;
            if self.term.is_some() && !canary(self.canary_deposed) {
                // Operations of the old term finish (or fail) on their own; none of their
                // ranges is held back in a term that will not hear of them.
                self.busy.clear();
            }
        }
        self.term = now;
        if let Some(term) = now {
            self.last_term = term;
        }
    }

    /// Whether no decided operation is in flight (a leadership handed over now fences none).
    pub fn is_idle(&self) -> bool {
        self.busy.is_empty()
    }

    /// Stops (or resumes) deciding while this node hands the vnode's leadership over: an
    /// operation half done when the leadership moves (a roll whose seal ran here and whose
    /// new head the next leader refuses) leaves its range without a writable head until the
    /// next leader rolls it again, which took producers a second in rolling restarts.
    pub fn hand_over(&mut self, handing_over: bool) {
        self.handing_over = handing_over;
    }

    /// The term decisions are made in now, if any.
    pub fn deciding_term(&self) -> Option<u64> {
        if self.handing_over {
            return None;
        }
        match self.term {
            Some(term) => Some(term),
            None if canary(self.canary_deposed) && self.last_term > 0 => Some(self.last_term),
            None => None,
        }
    }

    /// A broker holding a head asks for it to roll (full, old, failed, or found sealed): the
    /// roll to carry out now, unless this node does not decide, the range is no longer active,
    /// or an operation on it is in flight (it is asked again if still needed).
    pub fn roll_wanted(
        &mut self,
        meta: &MetaState,
        topic_id: u64,
        range_id: u32,
        term: u64,
    ) -> Option<Decision> {
        if self.deciding_term() != Some(term) || self.busy.contains(&(topic_id, range_id)) {
            return None;
        }
        let active = meta
            .topic(topic_id)
            .and_then(|topic| topic.ranges.get(&range_id))
            .is_some_and(|range| range.is_active());
        if !active {
            return None;
        }
        self.busy.insert((topic_id, range_id));
        Some(Decision { term, action: Action::Roll { topic_id, range_id } })
    }

    /// Broker `reporter`'s rates of the ranges it writes, at `now_ms`.
    pub fn load_report(&mut self, reporter: u64, rates: &[((u64, u32), Rate)], now_ms: u64) {
        if self.deciding_term().is_none() {
            return;
        }
        for ((topic_id, range_id), rate) in rates {
            self.rates.insert((*topic_id, *range_id, reporter), (*rate, now_ms));
        }
    }

    /// A range's rate: the sum of what every broker writing it reported.
    fn rate_of(&self, topic_id: u64, range_id: u32) -> Rate {
        let reports = self.rates.range((topic_id, range_id, 0)..=(topic_id, range_id, u64::MAX));
        reports.fold(Rate::default(), |sum, (_, (rate, _))| Rate {
            records_per_s: sum.records_per_s + rate.records_per_s,
            bytes_per_s: sum.bytes_per_s + rate.bytes_per_s,
        })
    }

    /// The driver finished (or gave up) an action decided earlier.
    pub fn finished(&mut self, action: &Action, now_ms: u64) {
        for range in action.ranges() {
            self.busy.remove(&range);
        }
        if let Action::Split { topic_id, .. } | Action::Merge { topic_id, .. } = action {
            self.last_reshape_ms.insert(*topic_id, now_ms);
        }
    }

    /// Marks the ranges of an action decided outside the tick (an operator's split or merge)
    /// as busy; `false` if one already is.
    pub fn claim(&mut self, action: &Action) -> bool {
        let ranges = action.ranges();
        if ranges.iter().any(|range| self.busy.contains(range)) {
            return false;
        }
        self.busy.extend(ranges);
        true
    }

    /// Decides what to do now: at most one reshape per topic by load, then a retention pass
    /// when one is due, under the cluster's `policies`. (Rolls are decided as they are asked
    /// for: producers wait on them.)
    pub fn tick(
        &mut self,
        meta: &MetaState,
        policies: &PolicyDefinitions,
        now_ms: u64,
    ) -> Vec<Decision> {
        let Some(term) = self.deciding_term() else { return Vec::new() };
        let stale_before = now_ms.saturating_sub(self.config.load.window_ms * REPORT_WINDOWS_KEPT);
        self.rates.retain(|_, (_, reported_ms)| *reported_ms >= stale_before);
        let mut actions = self.reshapes(meta, now_ms);
        for action in &actions {
            self.busy.extend(action.ranges());
        }
        actions.extend(self.retention(meta, policies, now_ms));
        actions.into_iter().map(|action| Decision { term, action }).collect()
    }

    fn reshapes(&self, meta: &MetaState, now_ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        for topic in meta.topics() {
            let ranges: Vec<ActiveRange> = topic
                .active_ranges()
                .map(|range| ActiveRange {
                    range_id: range.range_id,
                    start: range.extent.start,
                    end_inclusive: range.extent.end_inclusive,
                    created_ms: range.created_ms,
                })
                .collect();
            if ranges.iter().any(|range| self.busy.contains(&(topic.topic_id, range.range_id))) {
                continue;
            }
            let last = self.last_reshape_ms.get(&topic.topic_id).copied().unwrap_or(0);
            let rate_of = |range_id: u32| self.rate_of(topic.topic_id, range_id);
            let planned = plan_reshape(&ranges, rate_of, last, now_ms, &self.config.load);
            actions.extend(planned.map(|reshape| match reshape {
                Reshape::Split { range_id } => Action::Split { topic_id: topic.topic_id, range_id },
                Reshape::Merge { left, right } => {
                    Action::Merge { topic_id: topic.topic_id, left, right }
                }
            }));
        }
        actions
    }

    fn retention(
        &mut self,
        meta: &MetaState,
        policies: &PolicyDefinitions,
        now_ms: u64,
    ) -> Option<Action> {
        let due = self
            .last_retention_ms
            .is_none_or(|last| now_ms >= last.saturating_add(self.config.retention_interval_ms));
        if !due {
            return None;
        }
        self.last_retention_ms = Some(now_ms);
        let plan = meta.retention_plan(now_ms, policies, &self.config.retention);
        (!plan.is_empty()).then_some(Action::Expire { segments: plan })
    }
}

#[cfg(test)]
mod tests;
