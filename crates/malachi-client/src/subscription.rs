//! [`Subscription`]: the server pushes pages on the subscribe's `corr` and the client returns
//! window credit (and commits) with `stream_ack`, which is never answered.
//!
//! The subscription owns the connection: once subscribed, the server accepts nothing else on
//! it (any other request is answered `unexpected_frame`), and the subscription ends only when
//! the socket closes. Dropping the subscription closes it.

use bytes::Bytes;
use malachi_wire::messages::{FetchResponse, StreamAckRequest};
use malachi_wire::{Record, Request};
use tokio::sync::mpsc;

use crate::connection::{Connection, Push};
use crate::error::ClientError;

/// A subscribed connection.
#[derive(Debug)]
pub struct Subscription {
    connection: Connection,
    pushes: mpsc::Receiver<Push>,
    topic: Bytes,
    group: Option<Bytes>,
    member: Option<Bytes>,
}

impl Subscription {
    pub(crate) fn new(
        connection: Connection,
        pushes: mpsc::Receiver<Push>,
        topic: Bytes,
        group: Option<Bytes>,
        member: Option<Bytes>,
    ) -> Subscription {
        Subscription { connection, pushes, topic, group, member }
    }

    /// The next push with records and the cursor after them (pushes without records are
    /// skipped). Waits as long as it takes: wrap it in a timeout to bound it. A refused
    /// subscribe is the first result, as [`ClientError::Server`]; a closed connection is the
    /// last.
    pub async fn next(&mut self) -> Result<(Vec<Record>, Bytes), ClientError> {
        loop {
            let Some(push) = self.pushes.recv().await else {
                return Err(self.connection.close_cause().to_error());
            };
            let FetchResponse { records, next_cursor } = push?;
            if !records.is_empty() {
                return Ok((records, next_cursor));
            }
        }
    }

    /// Returns `count` records of window credit and, with a group, commits `cursor` as its
    /// position. Never answered: a failure to send is the only error.
    pub async fn ack(&self, cursor: &Bytes, count: u32) -> Result<(), ClientError> {
        self.stream_ack(Some(cursor.clone()), count).await
    }

    /// An ack without cursor or credit: keeps a group member's session alive while idle
    /// (subscriber.js sends one every 10 s; the session times out after 30 s).
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        self.stream_ack(None, 0).await
    }

    async fn stream_ack(&self, cursor: Option<Bytes>, count: u32) -> Result<(), ClientError> {
        let request = StreamAckRequest {
            topic: Some(self.topic.clone()),
            group: self.group.clone(),
            member: self.member.clone(),
            cursor,
            count,
        };
        self.connection.send_unanswered(Request::StreamAck(request)).await
    }
}
