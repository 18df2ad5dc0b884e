//! Section 3.3: `fetch` (3), `commit` (4), `subscribe` (5), `stream_ack` (6), `leave_group` (7).
//!
//! Clamping (`max` 0 → 100 and so on) is the server's business: these types carry the values
//! exactly as sent.

use bytes::Bytes;

use crate::layout::{List32, PresentStr, Str, U32, wire_struct};
use crate::record::Record;

wire_struct! {
    /// Key 3.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct FetchRequest {
        pub topic: Option<Bytes> = Str,
        /// `None`: no cursor (start from the group or the oldest record).
        pub cursor: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        /// Only meaningful together with `group`.
        pub member: Option<Bytes> = Str,
        /// Wire `max`: records per range read.
        pub max_records: u32 = U32,
        pub wait_ms: u32 = U32,
    }
}

wire_struct! {
    /// Key 3's ok answer, and the payload of every push on a subscription (key 5).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct FetchResponse {
        pub records: Vec<Record> = List32,
        /// Always present: an absent cursor here is a decode error.
        pub next_cursor: Bytes = PresentStr,
    }
}

wire_struct! {
    /// Key 4. An absent cursor commits nothing and is answered ok.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct CommitRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub cursor: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 5. Success sends no answer: the connection enters SUBSCRIBED mode.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct SubscribeRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
        /// Wire `window`: records pushed but not yet acked.
        pub window_records: u32 = U32,
        /// Wire `max`: records per push.
        pub max_records: u32 = U32,
    }
}

wire_struct! {
    /// Key 6. Never answered.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct StreamAckRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
        pub cursor: Option<Bytes> = Str,
        /// Records of window credit returned.
        pub count: u32 = U32,
    }
}

wire_struct! {
    /// Key 7. Ok answer: [`crate::messages::Empty`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct LeaveGroupRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
    }
}
