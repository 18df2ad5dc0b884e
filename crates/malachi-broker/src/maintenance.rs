//! Background work of a node: load-driven split and merge, age-based segment rolls, retention.
//! Each pass reads the clock once and hands the time to the pure planners.

use std::sync::Arc;
use std::time::Duration;

use crate::load::{ActiveRange, Reshape, plan_reshape};
use crate::node::Broker;

/// How often the maintenance loop looks at the topology.
const TICK_MS: u64 = 1_000;

impl Broker {
    /// Runs maintenance until the broker is dropped.
    pub fn spawn_maintenance(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last_retention_ms = 0;
            let mut leaders = crate::cluster::LeaderLog::default();
            loop {
                tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
                let Some(broker) = weak.upgrade() else { return };
                if broker.transport().is_some() {
                    broker.sync_addresses();
                    leaders.note(&broker.cluster_view());
                }
                broker.reshape_by_load().await;
                broker.roll_by_age().await;
                let now_ms = broker.clock.now_ms();
                broker.members.lock().expect("members lock poisoned").prune(now_ms);
                let now_ms = broker.clock.now_ms();
                if now_ms >= last_retention_ms + broker.config.retention_interval_ms {
                    last_retention_ms = now_ms;
                    if let Err(error) = broker.run_retention().await {
                        tracing::warn!(%error, "retention pass failed");
                    }
                }
            }
        })
    }

    /// One pass of the automatic split/merge trigger: at most one reshape per topic.
    pub async fn reshape_by_load(&self) {
        let now_ms = self.clock.now_ms();
        let topics: Vec<(u64, Vec<ActiveRange>)> = self.meta.read(|meta| {
            meta.0
                .topics()
                .map(|topic| {
                    let ranges = topic
                        .active_ranges()
                        .map(|range| ActiveRange {
                            range_id: range.range_id,
                            start: range.extent.start,
                            end_inclusive: range.extent.end_inclusive,
                            created_ms: range.created_ms,
                        })
                        .collect();
                    (topic.topic_id, ranges)
                })
                .collect()
        });
        for (topic_id, ranges) in topics {
            let last = self
                .last_reshape_ms
                .lock()
                .expect("reshape clock lock poisoned")
                .get(&topic_id)
                .copied()
                .unwrap_or(0);
            let decision = {
                let load = self.load.lock().expect("load lock poisoned");
                plan_reshape(
                    &ranges,
                    |range_id| load.rate(topic_id, range_id, now_ms),
                    last,
                    now_ms,
                    &self.config.load,
                )
            };
            let Some(reshape) = decision else { continue };
            let _reshape = self.reshape_lock.lock().await;
            let outcome = match reshape {
                Reshape::Split { range_id } => {
                    self.split_locked(topic_id, range_id).await.map(|_| ())
                }
                Reshape::Merge { left, right } => {
                    self.merge_locked(topic_id, left, right).await.map(|_| ())
                }
            };
            match outcome {
                Ok(()) => tracing::info!(topic_id, ?reshape, "load-driven reshape"),
                Err(error) => {
                    tracing::warn!(topic_id, ?reshape, %error, "load-driven reshape refused")
                }
            }
        }
        self.load.lock().expect("load lock poisoned").retain(|topic_id, range_id| {
            self.meta.read(|meta| {
                meta.0
                    .topic(topic_id)
                    .and_then(|topic| topic.ranges.get(&range_id))
                    .is_some_and(|range| range.is_active())
            })
        });
    }

    /// Requests a roll of every active segment older than its topic's age threshold that holds
    /// at least one record.
    pub async fn roll_by_age(&self) {
        let now_ms = self.clock.now_ms();
        let heads: Vec<(u64, u32, u64)> = self.meta.read(|meta| {
            meta.0
                .topics()
                .flat_map(|topic| {
                    topic.active_ranges().filter_map(move |range| {
                        range
                            .active_segment_id()
                            .map(|segment_id| (topic.topic_id, range.range_id, segment_id))
                    })
                })
                .collect()
        });
        for (topic_id, range_id, segment_id) in heads {
            let key = crate::data::SegmentKey { topic_id, range_id, segment_id };
            // Known without I/O when open or closed cleanly; otherwise opened once.
            let (durable_offset, durable_bytes) = match self.data.durable_end(key) {
                Some(end) => end,
                None => match self.segment(key).await {
                    Ok(segment) => {
                        let status = segment.status();
                        (status.durable_offset, status.durable_bytes)
                    }
                    Err(_) => continue,
                },
            };
            if durable_offset == 0 {
                continue;
            }
            let due = self.meta.read(|meta| {
                meta.0.roll_due(topic_id, range_id, durable_bytes, now_ms, &self.roll_defaults())
            });
            if due {
                self.request_roll(topic_id, range_id);
            }
        }
    }
}
