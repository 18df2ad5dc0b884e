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
//! Layouts (little-endian): a request is the segment key (`topic_id` u64, `range_id` u32,
//! `segment_id` u64) then the operation's arguments (the end of a head answers its durable
//! offset u64 and whether it is sealed there, u8); an answer starts with a status byte: 0
//! done (then the result), 1 fenced (append: the head was sealed; re-route) or gone (read and
//! end: metadata no longer lists the segment), 2 failed (then `retryable` u8 and the wire reason
//! as UTF-8). Records are `count` u32, then per record `flags` u8 (1 key present, 2
//! tombstone), `timestamp_ms` u64, key, value, `headers` u16 and each header's name and value,
//! every byte string as `len` u32 then the bytes.

use std::time::Duration;

use bytes::Bytes;
use malachi_log::Record;
use malachi_transport::{Request, Service};

use crate::data::SegmentKey;
use crate::error::LogError;
use crate::node::Broker;
use crate::produce::RangeBatch;

/// Data calls (`Service::Data`), by `kind`. Wire values; never reuse one.
pub const CALL_APPEND: u8 = 1;
pub const CALL_READ: u8 = 2;
pub const CALL_END: u8 = 3;
/// Seal an active segment (the coordinator's fence); answers its end offset and data bytes.
pub const CALL_SEAL: u8 = 4;
/// Create the file of a segment metadata has just allocated.
pub const CALL_CREATE: u8 = 5;
/// A batch the primary ships to a follower's copy (`replica.rs`).
pub const CALL_REPLICATE: u8 = 6;

/// How long a broker asked to create a segment's file waits to apply the metadata that
/// allocated it (the leader committed it; a follower applies it a moment later).
const CREATE_WAIT_MS: u64 = 2_000;

/// How long a forwarded operation may take: an append waits for the holder's fsync, which a
/// busy disk can delay for seconds.
const DATA_CALL_TIMEOUT_MS: u64 = 30_000;

pub(crate) const DONE: u8 = 0;
pub(crate) const FENCED_OR_GONE: u8 = 1;
const FAILED: u8 = 2;

/// What a forwarded leaf operation came to.
pub(crate) enum Remote<T> {
    Done(T),
    /// Append: the head was sealed under the request. Read or end: the segment is gone.
    FencedOrGone,
}

impl Broker {
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
        records: &[Record],
    ) -> Result<Remote<()>, LogError> {
        let mut payload = encode_key(key);
        encode_records(records, &mut payload);
        let answer = self.data_call(holder, CALL_APPEND, payload).await?;
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
        let mut payload = encode_key(key);
        payload.extend_from_slice(&from.to_le_bytes());
        payload.extend_from_slice(&wanted.to_le_bytes());
        payload.extend_from_slice(&bytes_max.to_le_bytes());
        let answer = self.data_call(holder, CALL_READ, payload).await?;
        decode_answer(&answer, |body| decode_records(&mut Reader(body)))
    }

    /// The durable end of active segment `key` on `holder`, and whether it is sealed there.
    pub(crate) async fn remote_end(
        &self,
        holder: u64,
        key: SegmentKey,
    ) -> Result<Remote<crate::fetch::HeadEnd>, LogError> {
        let answer = self.data_call(holder, CALL_END, encode_key(key)).await?;
        decode_answer(&answer, |body| {
            let mut reader = Reader(body);
            let offset = reader.u64()?;
            let sealed = reader.u8()? != 0;
            Ok(crate::fetch::HeadEnd { offset, sealed })
        })
    }

    /// Seals `key` on `holder` (the coordinator's fence there).
    pub(crate) async fn remote_seal(
        &self,
        holder: u64,
        key: SegmentKey,
    ) -> Result<Remote<malachi_meta::SealReport>, LogError> {
        let answer = self.data_call(holder, CALL_SEAL, encode_key(key)).await?;
        decode_answer(&answer, |body| {
            let mut reader = Reader(body);
            let (end_offset, data_bytes) = (reader.u64()?, reader.u64()?);
            Ok(malachi_meta::SealReport { segment_id: key.segment_id, end_offset, data_bytes })
        })
    }

    /// Creates `key`'s file on `holder`.
    pub(crate) async fn remote_create(&self, holder: u64, key: SegmentKey) -> Result<(), LogError> {
        let answer = self.data_call(holder, CALL_CREATE, encode_key(key)).await?;
        match decode_answer(&answer, |_| Ok(()))? {
            Remote::Done(()) => Ok(()),
            Remote::FencedOrGone => Err(LogError::NoSuchTopic),
        }
    }

    pub(crate) async fn data_call(
        &self,
        holder: u64,
        kind: u8,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, LogError> {
        // Membership already knows: answer at once instead of after a connect timeout.
        if self.member_status(holder) == crate::gossip::PeerStatus::Dead {
            return Err(LogError::Unavailable(format!(
                "broker {holder}, which holds the segment, is down (membership)"
            )));
        }
        self.data_call_within(holder, kind, payload, DATA_CALL_TIMEOUT_MS).await
    }

    /// A data call to `holder` answered within `timeout_ms`, made whatever membership says of
    /// it (a failover asks a broker suspected dead directly: one that answers is alive).
    pub(crate) async fn data_call_within(
        &self,
        holder: u64,
        kind: u8,
        payload: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, LogError> {
        let transport = self.transport().ok_or(LogError::NotOwner { holders: vec![holder] })?;
        let request = Request { service: Service::Data, group_id: 0, kind, payload };
        let timeout = Duration::from_millis(timeout_ms);
        transport.call(holder, request, timeout).await.map_err(|error| {
            LogError::Unavailable(format!("broker {holder}, which holds the segment: {error}"))
        })
    }

    /// Answers a peer's data call on a segment this broker holds.
    pub(crate) async fn handle_data_call(
        &self,
        sender: u64,
        request: Request,
    ) -> Result<Vec<u8>, String> {
        let mut reader = Reader(&request.payload);
        let key = decode_key(&mut reader)?;
        // The caller acts on metadata it has applied; this broker may not have yet (a segment
        // created a moment ago). Catch up before answering that it does not know the segment.
        if self.listed(key).is_none()
            && let Some(vnode) = self.ring.of_id(key.segment_id)
            && let Err(error) = vnode.group.read_barrier().await
        {
            tracing::debug!(?key, %error, "read barrier for an unknown segment failed");
        }
        match request.kind {
            CALL_REPLICATE => {
                return self.replicate_here(sender, key, &mut reader).await;
            }
            crate::failover::CALL_FENCE..=crate::failover::CALL_READ_RAW => {
                return self.handle_seal_call(request.kind, key, &mut reader).await;
            }
            crate::heal::CALL_SETTLE => return self.handle_settle_call(key, &mut reader).await,
            crate::describe::CALL_COPY_STATE => return Ok(self.handle_copy_state_call(key).await),
            _ => {}
        }
        let mut answer = vec![DONE];
        let outcome = match request.kind {
            CALL_APPEND => {
                let records = decode_records(&mut reader)?;
                self.append_here(key, records).await
            }
            CALL_READ => {
                let (from, wanted, bytes_max) = (reader.u64()?, reader.u32()?, reader.u64()?);
                // No more than a client may ask for at once, whatever the peer asked.
                let bytes_max = bytes_max.min(u64::from(self.config.max_frame_bytes));
                match self.read_copy(key, from, wanted, bytes_max).await {
                    Ok(Some(records)) => {
                        encode_records(&records, &mut answer);
                        Ok(true)
                    }
                    Ok(None) => Ok(false),
                    Err(error) => Err(error),
                }
            }
            CALL_SEAL => match self.seal_held(key).await {
                Ok(seal) => {
                    answer.extend_from_slice(&seal.end_offset.to_le_bytes());
                    answer.extend_from_slice(&seal.data_bytes.to_le_bytes());
                    Ok(true)
                }
                Err(LogError::NoSuchTopic) => Ok(false),
                Err(error) => Err(error),
            },
            CALL_CREATE => self.create_when_listed(key).await,
            CALL_END => match self.local_end(key).await {
                Ok(Some(end)) => {
                    answer.extend_from_slice(&end.offset.to_le_bytes());
                    answer.push(u8::from(end.sealed));
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(error) => Err(error),
            },
            other => return Err(format!("unknown data call {other}")),
        };
        Ok(match outcome {
            Ok(true) => answer,
            Ok(false) => vec![FENCED_OR_GONE],
            Err(error) => encode_failure(&error),
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
        let pass = self.append_local(vec![batch], &records).await;
        if pass.appended_any {
            self.notifier.notify(key.topic_id);
        }
        match pass.failure {
            Some(error) => Err(error),
            None => Ok(pass.fenced.is_empty()),
        }
    }
}

/// A data call's failure answer: retryable or not, then the wire reason.
pub(crate) fn encode_failure(error: &LogError) -> Vec<u8> {
    let mut failed = vec![FAILED, u8::from(error.is_retryable())];
    failed.extend_from_slice(error.reason().as_bytes());
    failed
}

pub(crate) fn encode_key(key: SegmentKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(&key.topic_id.to_le_bytes());
    out.extend_from_slice(&key.range_id.to_le_bytes());
    out.extend_from_slice(&key.segment_id.to_le_bytes());
    out
}

fn decode_key(reader: &mut Reader<'_>) -> Result<SegmentKey, String> {
    Ok(SegmentKey { topic_id: reader.u64()?, range_id: reader.u32()?, segment_id: reader.u64()? })
}

pub(crate) fn decode_answer<T>(
    answer: &[u8],
    done: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Remote<T>, LogError> {
    let malformed =
        |detail: String| LogError::Unavailable(format!("malformed data answer: {detail}"));
    match answer.split_first() {
        Some((&DONE, body)) => done(body).map(Remote::Done).map_err(malformed),
        Some((&FENCED_OR_GONE, _)) => Ok(Remote::FencedOrGone),
        Some((&FAILED, [retryable, reason @ ..])) => Err(LogError::Remote {
            reason: String::from_utf8_lossy(reason).into_owned(),
            retryable: *retryable != 0,
        }),
        _ => Err(malformed("unknown status".to_string())),
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("records are bounded far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Appends `records` to `out`: a count, the records, and a CRC32C of both, so that a record
/// damaged between brokers (forwarded, shipped to a follower, copied by a fill or a rebuild) is
/// refused, never written with a checksum of its own over the wrong bytes.
pub(crate) fn encode_records(records: &[Record], out: &mut Vec<u8>) {
    let from = out.len();
    let count = u32::try_from(records.len()).expect("batches are bounded far below 4 G records");
    out.extend_from_slice(&count.to_le_bytes());
    for record in records {
        let flags = u8::from(record.key.is_some()) | (u8::from(record.tombstone) << 1);
        out.push(flags);
        out.extend_from_slice(&record.timestamp_ms.to_le_bytes());
        put_bytes(out, record.key.as_deref().unwrap_or_default());
        put_bytes(out, &record.value);
        let headers = u16::try_from(record.headers.len()).expect("headers are bounded by limits");
        out.extend_from_slice(&headers.to_le_bytes());
        for (name, value) in &record.headers {
            put_bytes(out, name);
            put_bytes(out, value);
        }
    }
    let checksum = crc32c::crc32c(&out[from..]);
    out.extend_from_slice(&checksum.to_le_bytes());
}

/// Reads what [`encode_records`] wrote: the rest of `reader`, its checksum checked first.
pub(crate) fn decode_records(reader: &mut Reader<'_>) -> Result<Vec<Record>, String> {
    let Some((body, checksum)) = reader.0.split_last_chunk::<4>() else {
        return Err("truncated data call".to_string());
    };
    if crc32c::crc32c(body) != u32::from_le_bytes(*checksum) {
        return Err("records damaged in transit (checksum mismatch)".to_string());
    }
    let mut reader = Reader(body);
    let reader = &mut reader;
    let count = reader.u32()? as usize;
    // Every record takes at least 19 bytes: never reserve more than the payload can hold.
    let mut records = Vec::with_capacity(count.min(reader.0.len() / 19));
    for _ in 0..count {
        let flags = reader.u8()?;
        if flags & !3 != 0 {
            return Err(format!("unknown record flags {flags:#x}"));
        }
        let timestamp_ms = reader.u64()?;
        let key = reader.bytes()?;
        let value = reader.bytes()?;
        let header_count = reader.u16()?;
        let mut headers = Vec::with_capacity(usize::from(header_count).min(reader.0.len() / 8));
        for _ in 0..header_count {
            headers.push((reader.bytes()?, reader.bytes()?));
        }
        let key = (flags & 1 != 0).then_some(key);
        records.push(Record { key, value, headers, timestamp_ms, tombstone: flags & 2 != 0 });
    }
    if !reader.0.is_empty() {
        return Err(format!("{} bytes after the records", reader.0.len()));
    }
    Ok(records)
}

/// Reads little-endian fields off the front of a byte slice, failing on a short one.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let Some((head, rest)) = self.0.split_first_chunk::<N>() else {
            return Err("truncated data call".to_string());
        };
        self.0 = rest;
        Ok(*head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.take().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_le_bytes)
    }

    fn bytes(&mut self) -> Result<Bytes, String> {
        let len = self.u32()? as usize;
        if len > self.0.len() {
            return Err("truncated data call".to_string());
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(Bytes::copy_from_slice(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Record> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
        (
            proptest::option::of(bytes()),
            bytes(),
            proptest::collection::vec((bytes(), bytes()), 0..4),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(key, value, headers, timestamp_ms, tombstone)| Record {
                key,
                value,
                headers,
                timestamp_ms,
                tombstone,
            })
    }

    proptest! {
        #[test]
        fn records_round_trip(records in proptest::collection::vec(record(), 0..20)) {
            let mut bytes = Vec::new();
            encode_records(&records, &mut bytes);
            prop_assert_eq!(decode_records(&mut Reader(&bytes)).unwrap(), records.clone());
            // Every strict prefix is refused, never misread, and so is every flipped bit.
            for cut in 0..bytes.len() {
                prop_assert!(decode_records(&mut Reader(&bytes[..cut])).is_err());
            }
            for at in 0..bytes.len() {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << (at % 8);
                let refused = decode_records(&mut Reader(&flipped));
                prop_assert!(refused.unwrap_err().contains("checksum"), "byte {} flipped", at);
            }
        }
    }

    #[test]
    fn answers_decode_by_status() {
        let done = decode_answer(&[DONE, 7, 0, 0, 0, 0, 0, 0, 0], |body| Reader(body).u64());
        assert!(matches!(done, Ok(Remote::Done(7))));
        assert!(matches!(decode_answer(&[FENCED_OR_GONE], |_| Ok(())), Ok(Remote::FencedOrGone)));
        let mut failed = vec![FAILED, 1];
        failed.extend_from_slice(b"disk_full");
        match decode_answer(&failed, |_| Ok(())) {
            Err(error @ LogError::Remote { .. }) => {
                assert_eq!(error.reason(), "disk_full");
                assert!(error.is_retryable());
            }
            _ => panic!("a failure answer is the holder's reason"),
        }
        for bad in [&[][..], &[9], &[FAILED]] {
            assert!(matches!(decode_answer(bad, |_| Ok(())), Err(LogError::Unavailable(_))));
        }
        assert!(matches!(
            decode_answer(&[DONE, 1, 2], |body| Reader(body).u64()),
            Err(LogError::Unavailable(_))
        ));
        let mut flagged = Vec::new();
        let record = Record {
            key: None,
            value: Bytes::from_static(b"v"),
            headers: Vec::new(),
            timestamp_ms: 0,
            tombstone: false,
        };
        encode_records(&[record], &mut flagged);
        flagged[4] = 0x80;
        let body = flagged.len() - 4;
        let checksum = crc32c::crc32c(&flagged[..body]);
        flagged[body..].copy_from_slice(&checksum.to_le_bytes());
        assert!(decode_records(&mut Reader(&flagged)).unwrap_err().contains("flags"));
    }
}
