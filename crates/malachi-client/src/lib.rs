//! An async client for Malachi's binary protocol (`shared/spec/wire-protocol.md`, plus our keys
//! 64–72 of `docs/protocol.md`), over the shared codec of `malachi-wire`.
//!
//! What this crate owns: one TCP connection per [`Client`], many requests in flight on it at
//! once (a writer task, a reader task, and a map from `corr` to the waiting call), login on
//! connect, timeouts, typed errors that keep the server's reason text, and small helpers on top:
//! [`Consumer`] (cursor paging with group commits), [`GroupMember`] (a member of a group whose
//! members share the ranges) and [`ProduceBatch`] (batching records).
//!
//! What it must never do:
//! * Retry or reconnect behind the caller's back. A produce retried blindly can be written twice;
//!   the caller decides, helped by [`ClientError::is_retryable`].
//! * Interpret cursors: they are opaque ASCII tokens the server mints and checks.
//! * Block a runtime thread: every wait is async and bounded by a timeout, except
//!   [`Subscription::next`], which waits for the server's next push by design.
//!
//! ```no_run
//! # async fn example() -> Result<(), malachi_client::ClientError> {
//! use malachi_client::{Client, ClientConfig, FetchOptions, RecordBuilder};
//!
//! let config = ClientConfig::new("127.0.0.1:4040").credentials("app", "app123");
//! let client = Client::connect(config).await?;
//! client.produce("orders", vec![RecordBuilder::new("hello").key("k1").build()]).await?;
//! let (records, _cursor) = client.fetch("orders", &FetchOptions::default()).await?;
//! # Ok(()) }
//! ```

mod batch;
mod client;
mod connection;
mod consumer;
mod error;
mod member;
mod subscription;
mod tls;

#[cfg(test)]
mod fake_server;
#[cfg(test)]
mod tests;

pub use batch::{ProduceBatch, RecordBuilder, now_ms, record_wire_bytes};
pub use client::{Acl, Client, ClientConfig, Credentials, FetchOptions, SubscribeOptions, User};
pub use connection::{StreamReader, StreamWriter};
pub use consumer::{Consumer, ConsumerOptions};
pub use error::ClientError;
pub use member::{GroupMember, MemberOptions};
pub use subscription::Subscription;
pub use tls::TlsOptions;

pub use malachi_wire::PositionedEntry;
/// The wire types the client's methods take and return.
pub use malachi_wire::messages::{
    Assignment, ClusterBroker, ClusterGroup, ClusterStateResponse, ClusterStatusResponse,
    CopyDescription, DescribeSegmentsResponse, DescribeTopicResponse, DrainBrokerResponse,
    EffectiveField, GroupLagDescription, GroupLagResponse, LagStanding, NamedPolicy, Origin, Page,
    RangeDescription, RangeLagDescription, RangePosition, RangeState, Resolution,
    SegmentDescription, SegmentState, TopicPolicyResponse,
};
pub use malachi_wire::shapes::{Position, Start};
pub use malachi_wire::{Header, PolicyField, PolicyValue, Reason, Record, Request, Response};
