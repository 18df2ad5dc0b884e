//! Section 3.2: `create_topic` (1) and `produce` (2).

use bytes::Bytes;

use crate::layout::{List32, Str, U8, U32, wire_struct};
use crate::record::Record;

wire_struct! {
    /// Key 1. Ok answer: [`crate::messages::Empty`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct CreateTopicRequest {
        pub topic: Option<Bytes> = Str,
        /// Carried but ignored by Malachi, which always creates 2^8 keyspace positions (section 7
        /// item 1). The Node client sends 16.
        pub keyspace_bits: u8 = U8,
    }
}

wire_struct! {
    /// Key 2. An empty `records` list is valid (answered with count 0).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ProduceRequest {
        pub topic: Option<Bytes> = Str,
        pub records: Vec<Record> = List32,
    }
}

wire_struct! {
    /// Key 2's ok answer.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ProduceResponse {
        /// Records appended: always the request's count.
        pub count: u32 = U32,
    }
}
