//! Section 3.2: `create_topic` (1) and `produce` (2).

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};
use crate::record::Record;

/// Key 1. Ok answer: [`crate::messages::Empty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateTopicRequest {
    pub topic: Option<Bytes>,
    /// Carried but ignored by Malachi, which always creates 2^8 keyspace positions (section 7
    /// item 1). The Node client sends 16.
    pub keyspace_bits: u8,
}

/// Key 2. An empty `records` list is valid (answered with count 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceRequest {
    pub topic: Option<Bytes>,
    pub records: Vec<Record>,
}

/// Key 2's ok answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProduceResponse {
    /// Records appended: always the request's count.
    pub count: u32,
}

impl Wire for CreateTopicRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u8(self.keyspace_bits);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CreateTopicRequest { topic: reader.str()?, keyspace_bits: reader.u8()? })
    }
}

impl Wire for ProduceRequest {
    const WIRE_BYTES_MIN: usize = 5;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.list32(&self.records)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ProduceRequest { topic: reader.str()?, records: reader.list32()? })
    }
}

impl Wire for ProduceResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.count);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ProduceResponse { count: reader.u32()? })
    }
}
