//! One `/metrics` scrape: the state gauges of [`crate::metrics`] set from what this broker
//! holds and knows, then the whole registry rendered.
//!
//! Gauges of cluster-wide things (a topic's ranges, under-replicated segments, consumer lag) are
//! reported by the leader of the topic's vnode only, so summing a metric over every broker
//! counts each thing once. Lag reads each active head's end (a call to its primary when that
//! is another broker), so it covers at most `MALACHI_METRICS_TOPICS_MAX` topics per scrape.

use std::collections::BTreeMap;

use malachi_meta::MetaState;

use crate::data::SegmentKey;
use crate::gossip::PeerStatus;
use crate::metrics::{GroupLabel, LagLabels, NodeLabel, StateLabel};
use crate::node::Core;
use std::sync::Arc;

/// Membership status as the wire and the metrics number it.
pub fn status_code(status: PeerStatus) -> u8 {
    match status {
        PeerStatus::Alive => 0,
        PeerStatus::Suspect => 1,
        PeerStatus::Dead => 2,
    }
}

/// Log entries a group may hold unapplied and the broker still count as caught up.
const READY_APPLY_LAG_MAX: u64 = 1_000;

/// Segment copies held here, and their bytes.
#[derive(Debug, Default)]
struct Held {
    active: (i64, i64),
    sealed: (i64, i64),
}

/// The observing service: what operators see of this broker and its cluster (`/metrics`,
/// readiness, the segments' copies, consumer lag). It reads; it changes nothing.
pub struct Observer {
    core: Arc<Core>,
    /// One scrape at a time: a scrape clears and sets the state gauges.
    scraping: tokio::sync::Mutex<()>,
}

services_on_core!(Observer);

impl Observer {
    pub(crate) fn new(core: Arc<Core>) -> Observer {
        Observer { core, scraping: tokio::sync::Mutex::new(()) }
    }

    /// Whether this broker can serve now (`/ready`): its data plane takes writes, it has joined
    /// its cluster, every Raft group it is in knows a leader and has applied its log, and its
    /// copy of every vnode has caught up with the leader since it started
    /// ([`Core::catch_up_after_start`]); otherwise the first reason it cannot.
    pub fn readiness(&self) -> Result<(), String> {
        if self.data.commit_failed() {
            return Err("the group commit failed: the broker must restart".into());
        }
        if self.cluster.is_some() && !self.joined() {
            return Err("not joined to the cluster yet".into());
        }
        for row in self.raft_rows() {
            if row.leader.is_none() {
                return Err(format!("Raft group {} has no leader", row.name));
            }
            if row.apply_lag > READY_APPLY_LAG_MAX {
                return Err(format!("Raft group {} is {} entries behind", row.name, row.apply_lag));
            }
        }
        // The apply lag counts only what this broker already knows is committed: a follower
        // back from a restart may not have heard yet what its leader committed meanwhile.
        let behind = self.ring.iter().find(|vnode| !vnode.caught_up_since_start());
        if let (Some(vnode), Some(_)) = (behind, &self.cluster) {
            return Err(format!(
                "Raft group vnode-{} has not caught up with its leader since this broker started",
                vnode.vnode_id()
            ));
        }
        Ok(())
    }

    /// The registry in the Prometheus text format, its state gauges set from now.
    pub async fn render_metrics(&self) -> String {
        let _one_at_a_time = self.scraping.lock().await;
        self.scrape_segments();
        self.scrape_raft();
        self.scrape_membership();
        self.scrape_led_vnodes().await;
        self.metrics.encode()
    }

    fn scrape_segments(&self) {
        let keys: Vec<(SegmentKey, Option<u64>)> =
            self.read_every_meta(|meta| held_segments(meta, self.node_id));
        let mut held = Held::default();
        for (key, sealed_bytes) in keys {
            match sealed_bytes {
                Some(bytes) => {
                    held.sealed.0 += 1;
                    held.sealed.1 += bytes as i64;
                }
                None => {
                    held.active.0 += 1;
                    held.active.1 += self.data.durable_end(key).map_or(0, |end| end.1 as i64);
                }
            }
        }
        let gauges = &self.metrics.scraped;
        for (state, (count, bytes)) in [("active", held.active), ("sealed", held.sealed)] {
            let label = StateLabel { state: state.to_string() };
            gauges.segments.get_or_create(&label).set(count);
            gauges.segment_bytes.get_or_create(&label).set(bytes);
        }
    }

    /// Every Raft group this broker is in, as it sees it.
    fn raft_rows(&self) -> Vec<RaftRow> {
        let mut rows =
            vec![raft_row("admin".into(), &self.admin), raft_row("root".into(), &self.root)];
        for vnode in self.ring.iter() {
            rows.push(raft_row(format!("vnode-{}", vnode.vnode_id()), &vnode.group));
        }
        rows
    }

    fn scrape_raft(&self) {
        let gauges = &self.metrics.scraped;
        for row in self.raft_rows() {
            let label = GroupLabel { group: row.name };
            gauges.raft_term.get_or_create(&label).set(row.term as i64);
            gauges.raft_leader.get_or_create(&label).set(row.leader.unwrap_or(0) as i64);
            gauges.raft_is_leader.get_or_create(&label).set(i64::from(row.leads));
            let applied = row.applied.map_or(-1, |index| index as i64);
            gauges.raft_applied_index.get_or_create(&label).set(applied);
            gauges.raft_apply_lag.get_or_create(&label).set(row.apply_lag as i64);
        }
    }

    fn scrape_membership(&self) {
        let gauges = &self.metrics.scraped;
        gauges.broker_status.clear();
        for broker in self.cluster_view().brokers {
            let label = NodeLabel { node_id: broker.record.node_id.to_string() };
            gauges.broker_status.get_or_create(&label).set(i64::from(status_code(broker.status)));
        }
        gauges.replication_lag.clear();
        for (node, records) in self.broker().replicator.follower_lag() {
            let label = NodeLabel { node_id: node.to_string() };
            gauges.replication_lag.get_or_create(&label).set(records as i64);
        }
        let now_ms = self.clock.now_ms();
        let locked = self.broker().read_admin(|admin| admin.locked_count(now_ms));
        gauges.locked_accounts.set(locked as i64);
    }

    /// Ranges, under-replicated segments and consumer lag of the topics whose vnode this
    /// broker leads.
    async fn scrape_led_vnodes(&self) {
        let gauges = &self.metrics.scraped;
        let mut ranges: BTreeMap<String, i64> = BTreeMap::new();
        let mut under_replicated = 0;
        for vnode in self.ring.iter().filter(|vnode| vnode.group.is_leader()) {
            vnode.group.read(|meta| {
                for topic in meta.0.topics() {
                    let active = topic.ranges.values().filter(|r| r.is_active()).count() as i64;
                    *ranges.entry(topic.name.clone()).or_insert(0) += active;
                }
                under_replicated += self.under_replicated_in(&meta.0);
            });
        }
        gauges.under_replicated.set(under_replicated);
        gauges.topic_ranges.clear();
        gauges.consumer_lag.clear();
        let topics_max = self.config.dashboard.metrics_topics_max as usize;
        for (index, (topic, active)) in ranges.iter().enumerate() {
            let label = self.metrics.topic_label(topic);
            gauges.topic_ranges.get_or_create(&label).inc_by(*active);
            // Lag reads every head's end: only for the first topics (the CLI and the console
            // show every topic's).
            if index >= topics_max {
                continue;
            }
            let Ok(lags) = self.topic_group_lags(topic).await else { continue };
            for lag in lags {
                let labels = LagLabels { topic: label.topic.clone(), group: lag.group };
                gauges.consumer_lag.get_or_create(&labels).inc_by(lag.total as i64);
            }
        }
    }

    /// Segments of `meta` with fewer replicas than they should have, a replica on a dead
    /// broker, or (sealed) a copy not settled.
    fn under_replicated_in(&self, meta: &MetaState) -> i64 {
        let wanted = self.broker().coordination.replicas_wanted();
        let mut count = 0;
        for topic in meta.topics() {
            for range in topic.ranges.values() {
                for segment in meta.range_segments(topic.topic_id, range.range_id) {
                    if segment.staying_replicas().len() < wanted {
                        count += 1;
                        continue;
                    }
                    if segment.replicas.len() < 2 {
                        continue;
                    }
                    let dead = segment
                        .replicas
                        .iter()
                        .any(|&node| self.member_status(node) == PeerStatus::Dead);
                    let unsettled = !segment.is_active()
                        && segment.replicas.iter().any(|node| !segment.settled_on.contains(node));
                    count += i64::from(dead || unsettled);
                }
            }
        }
        count
    }
}

/// One Raft group as this broker sees it.
struct RaftRow {
    /// `admin`, `root` or `vnode-N`.
    name: String,
    leader: Option<u64>,
    term: u64,
    leads: bool,
    applied: Option<u64>,
    apply_lag: u64,
}

fn raft_row<M: malachi_consensus::StateMachine>(
    name: String,
    group: &malachi_consensus::RaftGroup<M>,
) -> RaftRow {
    let (leader, term) = group.leader();
    RaftRow {
        name,
        leader,
        term,
        leads: group.is_leader(),
        applied: group.applied_index(),
        apply_lag: group.apply_lag(),
    }
}

/// The segments of `meta` with a replica here: their key, and the sealed ones' bytes.
fn held_segments(meta: &MetaState, node_id: u64) -> Vec<(SegmentKey, Option<u64>)> {
    let mut held = Vec::new();
    for topic in meta.topics() {
        for range in topic.ranges.values() {
            for segment in meta.range_segments(topic.topic_id, range.range_id) {
                if !segment.replicas.contains(&node_id) {
                    continue;
                }
                let key = SegmentKey {
                    topic_id: segment.topic_id,
                    range_id: segment.range_id,
                    segment_id: segment.segment_id,
                };
                held.push((key, segment.sealed_length().map(|(_, bytes)| bytes)));
            }
        }
    }
    held
}
