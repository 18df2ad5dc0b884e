//! Segment operations on the broker that holds the segment, for a broker that does not: any
//! broker serves any produce and fetch, and the records go to (or come from) the holder over
//! the inter-node transport (`Service::Data`).
//!
//! The receiving broker routes, fences and builds cursors as for its own segments; only the
//! leaf operations on one segment travel: append a batch (answered once it is durable on the
//! holder), read from an offset, and the durable end of an active segment. The holder runs them
//! through its own door ([`Broker::segment`]), so its fences, group commit and load accounting
//! apply exactly as for a local client.
//!
//! The coordinator's fence travels the same way: seal a head on the broker holding it, and
//! create a new segment's file on the broker placement chose.
//!
//! The calls and their layouts are `peer`'s ([`crate::peer::DataCall`]).

use std::time::Duration;

use malachi_log::Record;

use crate::data::SegmentKey;
use crate::error::LogError;
use crate::node::Core;
use crate::peer::{
    DataCall, PeerCall, Reader, Remote, answer_of, decode_answer, decode_records, encode_records,
};
use crate::produce::RangeBatch;

/// How long a broker asked to create a segment's file waits to apply the metadata that
/// allocated it (the leader committed it; a follower applies it a moment later).
const CREATE_WAIT_MS: u64 = 2_000;

/// How long a forwarded operation may take: an append waits for the holder's fsync, which a
/// busy disk can delay for seconds.
const DATA_CALL_TIMEOUT_MS: u64 = 30_000;

impl Core {
    /// The primary of `key` when that is not this broker: appends, and reads of an active
    /// segment, go there.
    pub(crate) fn holder_elsewhere(&self, key: SegmentKey) -> Option<u64> {
        self.read_meta(key.segment_id, |meta| {
            let primary = *meta.segment(key.segment_id)?.replicas.first()?;
            (primary != self.node_id).then_some(primary)
        })
    }

    /// Appends `records` to `key` on `holder`; done once durable there.
    pub(crate) async fn remote_append(
        &self,
        holder: u64,
        key: SegmentKey,
        records: Vec<Record>,
    ) -> Result<Remote<()>, LogError> {
        let answer = self.data_call(holder, key, DataCall::Append { records }).await?;
        decode_answer(&answer, |_| Ok(()))
    }

    /// Reads up to `wanted` records (and about `bytes_max` bytes) of `key` from `from` on
    /// `holder`.
    pub(crate) async fn remote_read(
        &self,
        holder: u64,
        key: SegmentKey,
        (from, wanted, bytes_max): (u64, u32, u64),
    ) -> Result<Remote<Vec<Record>>, LogError> {
        let call = DataCall::Read { from, wanted, bytes_max };
        let answer = self.data_call(holder, key, call).await?;
        decode_answer(&answer, |body| decode_records(&mut Reader(body)))
    }

    /// The durable end of active segment `key` on `holder`, and whether it is sealed there.
    pub(crate) async fn remote_end(
        &self,
        holder: u64,
        key: SegmentKey,
    ) -> Result<Remote<crate::fetch::HeadEnd>, LogError> {
        let answer = self.data_call(holder, key, DataCall::End).await?;
        decode_answer(&answer, |body| {
            let mut reader = Reader(body);
            let end = crate::fetch::HeadEnd { offset: reader.u64()?, sealed: reader.u8()? != 0 };
            reader.end().map(|()| end)
        })
    }

    /// Seals `key` on `holder` (the coordinator's fence there).
    pub(crate) async fn remote_seal(
        &self,
        holder: u64,
        key: SegmentKey,
    ) -> Result<Remote<malachi_meta::SealReport>, LogError> {
        let answer = self.data_call(holder, key, DataCall::Seal).await?;
        decode_answer(&answer, |body| {
            let mut reader = Reader(body);
            let (end_offset, data_bytes) = (reader.u64()?, reader.u64()?);
            let report =
                malachi_meta::SealReport { segment_id: key.segment_id, end_offset, data_bytes };
            reader.end().map(|()| report)
        })
    }

    /// Creates `key`'s file on `holder`.
    pub(crate) async fn remote_create(&self, holder: u64, key: SegmentKey) -> Result<(), LogError> {
        let answer = self.data_call(holder, key, DataCall::Create).await?;
        match decode_answer(&answer, |_| Ok(()))? {
            Remote::Done(()) => Ok(()),
            Remote::FencedOrGone => Err(LogError::NoSuchTopic),
        }
    }

    pub(crate) async fn data_call(
        &self,
        holder: u64,
        key: SegmentKey,
        call: DataCall,
    ) -> Result<Vec<u8>, LogError> {
        // Membership already knows: answer at once instead of after a connect timeout.
        if self.member_status(holder) == crate::gossip::PeerStatus::Dead {
            return Err(LogError::Unavailable(format!(
                "broker {holder}, which holds the segment, is down (membership)"
            )));
        }
        self.data_call_within(holder, key, call, DATA_CALL_TIMEOUT_MS).await
    }

    /// A data call to `holder` answered within `timeout_ms`, made whatever membership says of
    /// it (a failover asks a broker suspected dead directly: one that answers is alive).
    pub(crate) async fn data_call_within(
        &self,
        holder: u64,
        key: SegmentKey,
        call: DataCall,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, LogError> {
        let transport = self.transport().ok_or(LogError::NotOwner { holders: vec![holder] })?;
        let request = PeerCall::Data { key, call }.encode();
        let timeout = Duration::from_millis(timeout_ms);
        transport.call(holder, request, timeout).await.map_err(|error| {
            LogError::Unavailable(format!("broker {holder}, which holds the segment: {error}"))
        })
    }

    /// The caller acts on metadata it has applied; this broker may not have yet (a segment
    /// created a moment ago). Catches up before a data call is answered that the segment is
    /// unknown.
    pub(crate) async fn catch_up_on(&self, key: SegmentKey) {
        if self.listed(key).is_none()
            && let Some(vnode) = self.ring.of_id(key.segment_id)
            && let Err(error) = vnode.group.read_barrier().await
        {
            tracing::debug!(?key, %error, "read barrier for an unknown segment failed");
        }
    }

    /// Answers a forwarded append.
    pub(crate) async fn answer_append(&self, key: SegmentKey, records: Vec<Record>) -> Vec<u8> {
        let appended = self.append_here(key, records).await;
        answer_of(appended.map(|appended| appended.then_some(())), |(), _| {})
    }

    /// Answers a forwarded read, of no more than a client may ask for at once, whatever the
    /// peer asked.
    pub(crate) async fn answer_read(
        &self,
        key: SegmentKey,
        from: u64,
        wanted: u32,
        bytes_max: u64,
    ) -> Vec<u8> {
        let bytes_max = bytes_max.min(u64::from(self.config.max_frame_bytes));
        let read = self.broker().read_copy(key, from, wanted, bytes_max).await;
        answer_of(read, |records, answer| encode_records(&records, answer))
    }

    /// Answers the coordinator's fence of a head held here.
    pub(crate) async fn answer_seal(&self, key: SegmentKey) -> Vec<u8> {
        let sealed = match self.broker().coordination.seal_held(key).await {
            Err(LogError::NoSuchTopic) => Ok(None),
            other => other.map(Some),
        };
        answer_of(sealed, |seal, answer| {
            answer.extend_from_slice(&seal.end_offset.to_le_bytes());
            answer.extend_from_slice(&seal.data_bytes.to_le_bytes());
        })
    }

    /// Answers a request to create a segment's file.
    pub(crate) async fn answer_create(&self, key: SegmentKey) -> Vec<u8> {
        let created = self.create_when_listed(key).await;
        answer_of(created.map(|created| created.then_some(())), |(), _| {})
    }

    /// Answers a request for a head's durable end.
    pub(crate) async fn answer_end(&self, key: SegmentKey) -> Vec<u8> {
        answer_of(self.broker().local_end(key).await, |end, answer| {
            answer.extend_from_slice(&end.offset.to_le_bytes());
            answer.push(u8::from(end.sealed));
        })
    }

    /// Creates `key`'s file once this broker's metadata lists it (`false`: it never did within
    /// `CREATE_WAIT_MS`, or the segment is gone).
    async fn create_when_listed(&self, key: SegmentKey) -> Result<bool, LogError> {
        const POLL_MS: u64 = 10;
        for _ in 0..CREATE_WAIT_MS / POLL_MS {
            if self.listed(key).is_some() {
                return self.create_segments(&[key]).await.map(|()| true);
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Ok(false)
    }

    /// A peer's batch for a head this broker holds, appended as a local produce's: `true`
    /// once durable, `false` if the head was sealed under it (healed here; the sender
    /// re-routes).
    async fn append_here(&self, key: SegmentKey, records: Vec<Record>) -> Result<bool, LogError> {
        if let Some(holder) = self.holder_elsewhere(key) {
            return Err(LogError::NotOwner { holders: vec![holder] });
        }
        // Not listed here even after the read barrier (no leader to ask, or the segment went):
        // the sender re-routes against its own metadata, which decides what the records meet.
        if self.listed(key).is_none() {
            return Ok(false);
        }
        let batch = RangeBatch { key, indexes: (0..records.len()).collect() };
        let pass = self.broker().append_local(vec![batch], &records).await;
        if pass.appended_any {
            self.notifier.notify(key.topic_id);
        }
        match pass.failure {
            Some(error) => Err(error),
            None => Ok(pass.fenced.is_empty()),
        }
    }
}
