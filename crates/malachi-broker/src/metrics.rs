//! What a broker counts for operators, in one prometheus-client registry per broker (brokers
//! simulated in one process stay apart), rendered in the Prometheus text format at `/metrics`
//! by `malachi-console`. Counters and histograms are updated where things happen; gauges of
//! state (segments, ranges, Raft groups, membership, replication, consumer lag) are set from the
//! broker's state at each scrape ([`Broker::render_metrics`], `scrape.rs`).
//!
//! Topic labels are capped: the first `MALACHI_METRICS_TOPICS_MAX` topic names a broker counts
//! get a series of their own, and every later one is counted under `topic="_other"`, so a
//! cluster with a million topics does not make a million series per metric. Names follow
//! Prometheus' conventions: the unit in the name (`_seconds`, `_bytes`, `_records`), counters
//! ending in `_total`.
//!
//! Nothing here decides anything: the timer reads the runtime's clock only to measure.

use malachi_reason::Reason;
use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The label of series kept for topics past the cap.
pub const OTHER_TOPICS: &str = "_other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoginLabels {
    /// `password`, `certificate` or `token`.
    pub method: String,
    /// `ok`, or the refusal's reason (`invalid_credentials`, `account_locked`, ...).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    /// The Raft group: `admin`, `root`, or `vnode-N`.
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LagLabels {
    pub topic: String,
    pub group: String,
}

/// The broker's registry and every metric in it.
#[derive(Debug)]
pub struct Metrics {
    pub(crate) registry: Registry,
    topics: Mutex<BTreeSet<String>>,
    topics_max: usize,
    produced_records: Family<TopicLabel, Counter>,
    produced_bytes: Family<TopicLabel, Counter>,
    fetched_records: Family<TopicLabel, Counter>,
    fetched_bytes: Family<TopicLabel, Counter>,
    /// Seconds from a produce request's arrival to its acknowledgement.
    pub produce_ack_seconds: Histogram,
    /// Client connections open now.
    pub connections: Gauge,
    /// Client connections accepted.
    pub connections_accepted: Counter,
    logins: Family<LoginLabels, Counter>,
    rate_limited: Family<KindLabel, Counter>,
    pub(crate) range_splits: Counter,
    pub(crate) range_merges: Counter,
    pub(crate) scraped: ScrapedGauges,
}

/// Gauges set from the broker's state at each scrape (cleared first, so series of things
/// that are gone disappear).
#[derive(Debug, Default)]
pub(crate) struct ScrapedGauges {
    pub(crate) segments: Family<StateLabel, Gauge>,
    pub(crate) segment_bytes: Family<StateLabel, Gauge>,
    pub(crate) topic_ranges: Family<TopicLabel, Gauge>,
    pub(crate) raft_term: Family<GroupLabel, Gauge>,
    pub(crate) raft_leader: Family<GroupLabel, Gauge>,
    pub(crate) raft_is_leader: Family<GroupLabel, Gauge>,
    pub(crate) raft_applied_index: Family<GroupLabel, Gauge>,
    pub(crate) raft_apply_lag: Family<GroupLabel, Gauge>,
    pub(crate) broker_status: Family<NodeLabel, Gauge>,
    pub(crate) replication_lag: Family<NodeLabel, Gauge>,
    pub(crate) under_replicated: Gauge,
    pub(crate) consumer_lag: Family<LagLabels, Gauge>,
    pub(crate) locked_accounts: Gauge,
}

impl Metrics {
    /// A registry with every metric of the broker, topic labels capped at `topics_max`, and
    /// the data plane's group-commit histograms.
    pub fn new(topics_max: usize, commit: &malachi_log::CommitMetrics) -> Metrics {
        let mut registry = Registry::with_prefix("malachi");
        let metrics = Metrics {
            registry: Registry::default(),
            topics: Mutex::new(BTreeSet::new()),
            topics_max,
            produced_records: Family::default(),
            produced_bytes: Family::default(),
            fetched_records: Family::default(),
            fetched_bytes: Family::default(),
            // 100 us to about 3.3 s.
            produce_ack_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 16)),
            connections: Gauge::default(),
            connections_accepted: Counter::default(),
            logins: Family::default(),
            rate_limited: Family::default(),
            range_splits: Counter::default(),
            range_merges: Counter::default(),
            scraped: ScrapedGauges::default(),
        };
        let m = &metrics;
        let r = &mut registry;
        r.register(
            "produced_records",
            "Records acknowledged to producers",
            m.produced_records.clone(),
        );
        r.register(
            "produced_bytes",
            "Bytes of records (keys, values, headers) acknowledged to producers",
            m.produced_bytes.clone(),
        );
        r.register("fetched_records", "Records returned to consumers", m.fetched_records.clone());
        r.register(
            "fetched_bytes",
            "Wire bytes of records returned to consumers",
            m.fetched_bytes.clone(),
        );
        r.register(
            "produce_ack_seconds",
            "Seconds from a produce request's arrival to its acknowledgement (durable on a quorum)",
            m.produce_ack_seconds.clone(),
        );
        r.register("commit_sync_seconds", "Seconds one group-commit round takes to make its writes durable (the journal's write and fdatasync by default)", commit.sync_seconds.clone());
        r.register(
            "commit_round_bytes",
            "Bytes one group-commit round wrote",
            commit.round_bytes.clone(),
        );
        r.register(
            "commit_round_segments",
            "Segments one group-commit round made durable",
            commit.round_segments.clone(),
        );
        r.register("connections", "Client connections open now", m.connections.clone());
        r.register(
            "connections_accepted",
            "Client connections accepted",
            m.connections_accepted.clone(),
        );
        r.register(
            "logins",
            "Login attempts by method and outcome (ok, or the refusal's reason)",
            m.logins.clone(),
        );
        r.register("rate_limited", "Requests refused for a rate limit or quota, by kind (login, publish, subscribe, connection)", m.rate_limited.clone());
        r.register(
            "range_splits",
            "Ranges this broker split as its vnode's coordinator or for an operator",
            m.range_splits.clone(),
        );
        r.register("range_merges", "Range pairs this broker merged", m.range_merges.clone());
        let g = &m.scraped;
        r.register(
            "segments",
            "Segment copies held on this broker, by state (active, sealed)",
            g.segments.clone(),
        );
        r.register(
            "segment_bytes",
            "Bytes of the segment copies held on this broker, by state",
            g.segment_bytes.clone(),
        );
        r.register(
            "topic_ranges",
            "Active ranges per topic (reported by the topic's vnode leader)",
            g.topic_ranges.clone(),
        );
        r.register("raft_term", "The Raft term this broker knows, per group", g.raft_term.clone());
        r.register(
            "raft_leader",
            "The leader this broker knows (node id, 0 for none), per group",
            g.raft_leader.clone(),
        );
        r.register(
            "raft_is_leader",
            "1 where this broker leads the group",
            g.raft_is_leader.clone(),
        );
        r.register(
            "raft_applied_index",
            "The last log index this broker applied, per group",
            g.raft_applied_index.clone(),
        );
        r.register(
            "raft_apply_lag_entries",
            "Log entries this broker holds but has not applied yet, per group",
            g.raft_apply_lag.clone(),
        );
        r.register(
            "broker_status",
            "Each broker's membership status as this broker sees it (0 alive, 1 suspect, 2 dead)",
            g.broker_status.clone(),
        );
        r.register("replication_lag_records", "Records staged on this broker's replicated heads that a follower has not made durable yet, per follower", g.replication_lag.clone());
        r.register("under_replicated_segments", "Segments with fewer replicas than the replication factor, a replica whose broker is dead, or a copy not settled (reported by the vnodes' leaders)", g.under_replicated.clone());
        r.register("consumer_lag_records", "Records between a consumer group's committed position and the end of each range, summed per topic (reported by the topic's vnode leader)", g.consumer_lag.clone());
        r.register(
            "locked_accounts",
            "(user, address) pairs locked out of logging in now",
            g.locked_accounts.clone(),
        );
        Metrics { registry, ..metrics }
    }

    /// The label for `topic`: its name while under the cap (or already counted), else
    /// [`OTHER_TOPICS`].
    pub fn topic_label(&self, topic: &str) -> TopicLabel {
        let mut topics = self.topics.lock().expect("metrics topics lock poisoned");
        if topics.contains(topic) {
            return TopicLabel { topic: topic.to_string() };
        }
        if topics.len() < self.topics_max {
            topics.insert(topic.to_string());
            return TopicLabel { topic: topic.to_string() };
        }
        TopicLabel { topic: OTHER_TOPICS.to_string() }
    }

    pub(crate) fn produced(&self, topic: &str, records: u64, bytes: u64) {
        let label = self.topic_label(topic);
        self.produced_records.get_or_create(&label).inc_by(records);
        self.produced_bytes.get_or_create(&label).inc_by(bytes);
    }

    pub(crate) fn fetched(&self, topic: &str, records: u64, bytes: u64) {
        if records == 0 {
            return;
        }
        let label = self.topic_label(topic);
        self.fetched_records.get_or_create(&label).inc_by(records);
        self.fetched_bytes.get_or_create(&label).inc_by(bytes);
    }

    /// One login attempt by `method` (`password`, `certificate`, `token`): `ok` or the reason.
    pub fn login(&self, method: &str, outcome: &str) {
        let labels = LoginLabels { method: method.to_string(), outcome: outcome.to_string() };
        self.logins.get_or_create(&labels).inc();
        if outcome == Reason::RateLimited.as_str() {
            self.refused_for_rate("login");
        }
    }

    /// A client connection was accepted; it counts as open until the guard drops.
    pub fn connection_opened(&self) -> OpenConnection {
        self.connections_accepted.inc();
        self.connections.inc();
        OpenConnection(self.connections.clone())
    }

    /// A request refused for a rate limit or quota of `kind`.
    pub fn refused_for_rate(&self, kind: &str) {
        self.rate_limited.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    }

    /// The registry in the Prometheus text format (version 0.0.4).
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

/// An open client connection, counted in `malachi_connections` until dropped.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The content type of [`Broker::render_metrics`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Measures how long something took, on the runtime's clock (simulated under the simulator).
#[derive(Clone, Copy, Debug)]
pub struct Timer(tokio::time::Instant);

impl Timer {
    pub fn start() -> Timer {
        Timer(tokio::time::Instant::now())
    }

    pub fn observe(self, histogram: &Histogram) {
        histogram.observe(self.0.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_labels_are_capped() {
        let metrics = Metrics::new(2, &malachi_log::CommitMetrics::default());
        // (topic, label)
        let cases = [("a", "a"), ("b", "b"), ("c", OTHER_TOPICS), ("a", "a"), ("d", OTHER_TOPICS)];
        for (topic, label) in cases {
            assert_eq!(metrics.topic_label(topic).topic, label, "{topic}");
        }
    }

    #[test]
    fn counters_render_in_the_prometheus_text_format() {
        let metrics = Metrics::new(1, &malachi_log::CommitMetrics::default());
        metrics.produced("orders", 3, 300);
        metrics.produced("audit", 2, 20);
        metrics.login("password", "invalid_credentials");
        metrics.login("password", "rate_limited");
        let text = metrics.encode();
        let expected = [
            "# TYPE malachi_produced_records_total counter",
            "malachi_produced_records_total{topic=\"orders\"} 3",
            "malachi_produced_records_total{topic=\"_other\"} 2",
            "malachi_produced_bytes_total{topic=\"orders\"} 300",
            "malachi_logins_total{method=\"password\",outcome=\"invalid_credentials\"} 1",
            "malachi_rate_limited_total{kind=\"login\"} 1",
            "# TYPE malachi_produce_ack_seconds histogram",
            "malachi_commit_sync_seconds_count 0",
        ];
        for line in expected {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
    }
}
