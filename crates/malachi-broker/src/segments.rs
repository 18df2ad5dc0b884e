//! The broker's one door to its segment files: what metadata says of a segment decides what a
//! missing or unborn file means ([`Listed`]), and files this node creates are reported to
//! metadata, so that from then on a missing one is damage, not a create that never happened.

use std::sync::Arc;

use malachi_log::Segment;
use malachi_meta::{MetaCommand, MetaState};

use crate::data::{DataError, Listed, SegmentKey};
use crate::error::LogError;
use crate::node::Core;

/// Segment ids in one `SegmentFilesCreated` or `ReclaimDone` command: far below the metadata
/// machine's item limit, so a long list goes in several commands rather than one refused one.
pub(crate) const SEGMENT_IDS_PER_COMMAND_MAX: usize = 1_000;

impl Core {
    /// What metadata says of `key`'s file on this node; `None` once metadata no longer lists it.
    pub(crate) fn listed(&self, key: SegmentKey) -> Option<Listed> {
        self.read_meta(key.segment_id, |meta| listed_in(meta, key, self.node_id))
    }

    /// The segment, opened (recovered, or created if it never was) as metadata says. A head
    /// that recovery found damaged (it reports itself sealed) is rolled at once, so readers of
    /// its range meet the damage and the range takes writes again without waiting for a
    /// produce.
    pub(crate) async fn segment(&self, key: SegmentKey) -> Result<Arc<Segment>, DataError> {
        self.check_held_here(key)?;
        let opened = self.data.open(key, || self.listed(key)).await?;
        self.opened_copy(key, opened.created, opened.fresh);
        if opened.report_created {
            self.report_created(vec![key.segment_id]).await;
        }
        if opened.fresh
            && opened.segment.status().sealed.is_some()
            && matches!(self.listed(key), Some(Listed::ActiveCreated | Listed::ActiveUnborn))
            && let Some(broker) = self.self_handle()
        {
            broker.coordination.request_roll(key.topic_id, key.range_id);
        }
        Ok(opened.segment)
    }

    /// Tells replication that this broker opened its copy of `key`: created now, or written
    /// by an earlier process (`fresh`). A task may still open segments while its broker stops;
    /// then there is no replication left to tell.
    fn opened_copy(&self, key: SegmentKey, created: bool, fresh: bool) {
        if !created && !fresh {
            return;
        }
        let Some(broker) = self.self_handle() else { return };
        if created {
            broker.replicator.created_copy(key);
        } else if fresh {
            broker.replicator.recovered_copy(key);
        }
    }

    /// Creates the files of segments metadata has just allocated and reports them together.
    pub(crate) async fn create_segments(&self, keys: &[SegmentKey]) -> Result<(), LogError> {
        let mut created = Vec::new();
        for &key in keys {
            self.check_held_here(key)?;
            let opened = self.data.open(key, || self.listed(key)).await?;
            self.opened_copy(key, opened.created, opened.fresh);
            if opened.report_created {
                created.push(key.segment_id);
            }
        }
        self.report_created(created).await;
        Ok(())
    }

    /// Records in metadata that this node's files of `segment_ids` exist. A failure is only
    /// logged: the file is there, and until metadata hears of it a missing file would be
    /// created again, the behaviour before the report.
    async fn report_created(&self, segment_ids: Vec<u64>) {
        let mut by_vnode: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
        for segment_id in segment_ids {
            by_vnode.entry(malachi_meta::vnode_of_id(segment_id)).or_default().push(segment_id);
        }
        for segment_ids in by_vnode.into_values() {
            for chunk in segment_ids.chunks(SEGMENT_IDS_PER_COMMAND_MAX) {
                let command = MetaCommand::SegmentFilesCreated {
                    node_id: self.node_id,
                    segment_ids: chunk.to_vec(),
                };
                if let Err(error) = self.propose_meta(chunk[0], command).await {
                    tracing::warn!(%error, "recording created segment files failed");
                }
            }
        }
    }

    /// Refuses a segment whose replicas are all on other brokers: its file must never be
    /// created here, where nobody would read it and a second copy would diverge.
    fn check_held_here(&self, key: SegmentKey) -> Result<(), DataError> {
        let holders = self.read_meta(key.segment_id, |meta| {
            meta.segment(key.segment_id)
                .filter(|segment| !segment.replicas.contains(&self.node_id))
                .map(|segment| segment.replicas.clone())
        });
        match holders {
            Some(holders) => Err(DataError::Elsewhere { key, holders }),
            None => Ok(()),
        }
    }

    /// Records durable in an active segment.
    pub(crate) async fn active_durable_end(&self, key: SegmentKey) -> Result<u64, DataError> {
        if let Some(end) = self.data.durable_end(key) {
            return Ok(end.0);
        }
        Ok(self.segment(key).await?.durable_offset())
    }
}

fn listed_in(meta: &MetaState, key: SegmentKey, node_id: u64) -> Option<Listed> {
    let segment = meta.segment(key.segment_id)?;
    if (segment.topic_id, segment.range_id) != (key.topic_id, key.range_id) {
        return None;
    }
    Some(match segment.sealed_length() {
        Some((end_offset, _)) => Listed::Sealed { end_offset },
        None if segment.created_on.contains(&node_id) => Listed::ActiveCreated,
        None => Listed::ActiveUnborn,
    })
}
