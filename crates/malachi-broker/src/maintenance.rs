//! Background work of a broker, once per tick: the cluster's bookkeeping (addresses, leaders
//! seen), coordination (`coordinate.rs`: this broker's heads, and the vnode's decisions while it
//! leads), the expiry of soft group members, and the deletion of its own files of segments
//! metadata no longer lists.

use std::sync::Arc;
use std::time::Duration;

use crate::error::LogError;
use crate::node::{Broker, retention_defaults};

/// How often the maintenance loop runs.
const TICK_MS: u64 = 1_000;

impl Broker {
    /// Runs maintenance until the broker is dropped.
    pub fn spawn_maintenance(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last_reclaim_ms = 0;
            let mut leaders = crate::cluster::LeaderLog::default();
            loop {
                tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
                let Some(broker) = weak.upgrade() else { return };
                if broker.transport().is_some() {
                    broker.sync_addresses();
                    leaders.note(&broker.cluster_view());
                }
                broker.seats.reconcile_seats().await;
                broker.coordination.coordinate_once().await;
                broker.healer.scrub_once().await;
                broker.handover.renew_once().await;
                let now_ms = broker.clock.now_ms();
                broker.groups.prune(now_ms);
                // Dropped copies are deleted on the next tick, not the next retention pass: a
                // broker back from a long absence learns of them only once it has caught up.
                let due = now_ms >= last_reclaim_ms + broker.config.retention_interval_ms;
                if due || broker.holds_dropped_copies() {
                    last_reclaim_ms = now_ms;
                    if let Err(error) = broker.reclaim().await {
                        tracing::warn!(%error, "deleting the files of removed segments failed");
                    }
                }
            }
        })
    }

    /// One retention pass now: on each vnode this broker leads, expire what the bound policies
    /// allow; on every broker, delete its files of removed segments. Returns the records
    /// expired.
    pub async fn run_retention(&self) -> Result<u64, LogError> {
        let now_ms = self.clock.now_ms();
        let defaults = retention_defaults(&self.config);
        let policies = self.admin_service.policy_definitions();
        let (mut expired, mut failure) = (0, None);
        for vnode in self.ring.iter() {
            let (leader, term) = vnode.group.leader();
            if leader != Some(self.node_id) {
                continue;
            }
            let plan = vnode.group.read(|meta| meta.0.retention_plan(now_ms, &policies, &defaults));
            // One vnode that cannot expire now (it just lost its leadership) holds back no other.
            match self.coordination.expire_in(term, &plan).await {
                Ok(records) => expired += records,
                Err(error) => {
                    tracing::warn!(vnode = vnode.vnode_id(), %error, "a retention pass failed");
                    failure.get_or_insert(error);
                }
            }
        }
        self.reclaim().await?;
        failure.map_or(Ok(expired), Err)
    }
}
