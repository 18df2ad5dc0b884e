//! Section 3.3: `fetch` (3), `commit` (4), `subscribe` (5), `stream_ack` (6), `leave_group` (7).
//!
//! Clamping (`max` 0 → 100 and so on) is the server's business: these types carry the values
//! exactly as sent.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};
use crate::record::Record;

/// Key 3.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchRequest {
    pub topic: Option<Bytes>,
    /// `None`: no cursor (start from the group or the oldest record).
    pub cursor: Option<Bytes>,
    pub group: Option<Bytes>,
    /// Only meaningful together with `group`.
    pub member: Option<Bytes>,
    /// Wire `max`: records per range read.
    pub max_records: u32,
    pub wait_ms: u32,
}

/// Key 3's ok answer, and the payload of every push on a subscription (key 5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchResponse {
    pub records: Vec<Record>,
    /// Always present: an absent cursor here is a decode error.
    pub next_cursor: Bytes,
}

/// Key 4. An absent cursor commits nothing and is answered ok.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub cursor: Option<Bytes>,
}

/// Key 5. Success sends no answer: the connection enters SUBSCRIBED mode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
    /// Wire `window`: records pushed but not yet acked.
    pub window_records: u32,
    /// Wire `max`: records per push.
    pub max_records: u32,
}

/// Key 6. Never answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamAckRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
    pub cursor: Option<Bytes>,
    /// Records of window credit returned.
    pub count: u32,
}

/// Key 7. Ok answer: [`crate::messages::Empty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaveGroupRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
}

impl Wire for FetchRequest {
    const WIRE_BYTES_MIN: usize = 4 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.cursor.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())?;
        writer.u32(self.max_records);
        writer.u32(self.wait_ms);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(FetchRequest {
            topic: reader.str()?,
            cursor: reader.str()?,
            group: reader.str()?,
            member: reader.str()?,
            max_records: reader.u32()?,
            wait_ms: reader.u32()?,
        })
    }
}

impl Wire for FetchResponse {
    const WIRE_BYTES_MIN: usize = 4 + 5;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.records)?;
        writer.present_str(&self.next_cursor)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(FetchResponse {
            records: reader.list32()?,
            next_cursor: reader.present_str("next_cursor")?,
        })
    }
}

impl Wire for CommitRequest {
    const WIRE_BYTES_MIN: usize = 3;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.cursor.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CommitRequest { topic: reader.str()?, group: reader.str()?, cursor: reader.str()? })
    }
}

impl Wire for SubscribeRequest {
    const WIRE_BYTES_MIN: usize = 3 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())?;
        writer.u32(self.window_records);
        writer.u32(self.max_records);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(SubscribeRequest {
            topic: reader.str()?,
            group: reader.str()?,
            member: reader.str()?,
            window_records: reader.u32()?,
            max_records: reader.u32()?,
        })
    }
}

impl Wire for StreamAckRequest {
    const WIRE_BYTES_MIN: usize = 4 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())?;
        writer.str(self.cursor.as_deref())?;
        writer.u32(self.count);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(StreamAckRequest {
            topic: reader.str()?,
            group: reader.str()?,
            member: reader.str()?,
            cursor: reader.str()?,
            count: reader.u32()?,
        })
    }
}

impl Wire for LeaveGroupRequest {
    const WIRE_BYTES_MIN: usize = 3;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(LeaveGroupRequest { topic: reader.str()?, group: reader.str()?, member: reader.str()? })
    }
}
