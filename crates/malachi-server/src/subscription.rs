//! SUBSCRIBED mode (wire-protocol.md section 3.3, keys 5 and 6): the backlog, then new records as
//! they land, pushed on the subscribe's corr while credit lasts; `stream_ack` commits the group
//! and returns credit. Any other frame is `unexpected_frame`; the subscription ends with the
//! connection.
//!
//! The right to read is not fixed at subscribe time: before every push, and every time the loop
//! comes round (at least once per poll), the session must still stand and P(consume, topic)
//! still hold. Once either fails (a revoked grant or permission, a deleted user, a changed
//! password), the subscription ends with `permission_denied` on its corr and the connection
//! closes: no record is pushed past the revocation, and an idle subscription notices within
//! one poll.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use malachi_broker::fetch::{FetchArgs, FetchPage, clamp_max};
use malachi_broker::node::Broker;
use malachi_meta::Operation;
use malachi_wire::messages::{StreamAckRequest, SubscribeRequest};
use malachi_wire::{ApiKey, Reason, Request, RequestEnvelope, Response, ResponseFrame};

use crate::connection::{Connection, Frames, Outcome};
use crate::convert::text;
use crate::dispatch::page_to_wire;

/// The window clamps of section 3.3.
pub const WINDOW_DEFAULT: u32 = 100;
pub const WINDOW_MAX: u32 = 10_000;
/// A push waits this long for new records before looking again (frames interrupt it at once);
/// also the longest an idle subscription takes to notice that it may no longer read.
const POLL_WAIT_MS: u32 = 5_000;

pub struct Subscription {
    corr: u32,
    topic: String,
    group: Option<String>,
    member: Option<String>,
    window: u32,
    max: u32,
}

/// The subscription's moving parts.
struct Progress {
    cursor: Option<String>,
    in_flight: u32,
}

pub(crate) fn open(connection: &Connection, corr: u32, request: SubscribeRequest) -> Outcome {
    let Some(topic) = text(&request.topic) else {
        return Connection::refuse(corr, Reason::NoSuchTopic.as_str());
    };
    if !connection.permitted(Operation::Consume, &topic) {
        return Connection::refuse(corr, Reason::PermissionDenied.as_str());
    }
    let now_ms = connection.broker.clock().now_ms();
    let user = &connection.session.username;
    if let Err(reason) = connection.shared.quotas.charge_subscribe(user, now_ms) {
        connection.broker.metrics().refused_for_rate("subscribe");
        return Connection::refuse(corr, reason.as_str());
    }
    let window = match request.window_records {
        0 => WINDOW_DEFAULT,
        window => window.min(WINDOW_MAX),
    };
    Outcome::Subscribe(Subscription {
        corr,
        topic,
        group: text(&request.group),
        member: text(&request.group).and(text(&request.member)),
        window,
        max: clamp_max(request.max_records),
    })
}

impl Subscription {
    pub(crate) async fn run(self, connection: &mut Connection, frames: &mut Frames) {
        let mut progress = Progress { cursor: None, in_flight: 0 };
        let mut closing = connection.shared.closing.subscribe();
        loop {
            if !self.may_read(connection) {
                self.deny(connection).await;
                break;
            }
            let credit = self.window.saturating_sub(progress.in_flight);
            let page =
                next_page(Arc::clone(&connection.broker), self.fetch_plan(&progress), credit);
            // Biased: the client's frames (acks, stop) first, and no runtime randomness in the
            // choice, so a simulated run replays exactly.
            tokio::select! {
                biased;
                // The server stops: the consumer resumes from its cursor on another broker.
                () = crate::closed(&mut closing) => break,
                next = frames.next() => match next {
                    None => break,
                    Some(Err(error)) => {
                        connection.fail_frame(error).await;
                        break;
                    }
                    Some(Ok(body)) => {
                        if self.on_frame(connection, body, &mut progress).await.is_err() {
                            break;
                        }
                    }
                },
                page = page, if credit > 0 => {
                    // Read while allowed; pushed only if still allowed after the wait.
                    if !self.may_read(connection) {
                        self.deny(connection).await;
                        break;
                    }
                    if self.on_page(connection, page, &mut progress).await.is_err() {
                        break;
                    }
                }
            }
        }
        if let (Some(group), Some(member)) = (&self.group, &self.member) {
            connection.broker.groups().leave_group(&self.topic, group, member);
        }
    }

    /// The session still stands and may still consume from the topic.
    fn may_read(&self, connection: &Connection) -> bool {
        connection.session_alive() && connection.permitted(Operation::Consume, &self.topic)
    }

    /// Ends the subscription: `permission_denied` on its corr; the connection closes after.
    async fn deny(&self, connection: &mut Connection) {
        let _ = connection.send(&ResponseFrame::error(self.corr, Reason::PermissionDenied)).await;
    }

    /// What the next fetch starts from: the subscription's own cursor once it has one, the
    /// group's committed position (or the start) before.
    fn fetch_plan(
        &self,
        progress: &Progress,
    ) -> (String, Option<String>, Option<String>, Option<String>, u32) {
        let from_group = progress.cursor.is_none();
        (
            self.topic.clone(),
            progress.cursor.clone(),
            self.group.clone().filter(|_| from_group),
            self.member.clone().filter(|_| from_group),
            self.max,
        )
    }

    async fn on_page(
        &self,
        connection: &mut Connection,
        page: Result<FetchPage, String>,
        progress: &mut Progress,
    ) -> std::io::Result<()> {
        match page {
            Ok(page) if page.records.is_empty() => {
                if page.next_cursor.is_empty() {
                    // The topic does not exist (yet): the subscription stays open, as the
                    // original's does, and looks again shortly instead of spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                } else {
                    progress.cursor = Some(page.next_cursor);
                }
                Ok(())
            }
            Ok(page) => {
                progress.in_flight += page.records.len() as u32;
                progress.cursor = Some(page.next_cursor.clone());
                let push = ResponseFrame::ok(self.corr, Response::Subscribe(page_to_wire(page)));
                connection.send(&push).await
            }
            Err(reason) => {
                // A deleted topic or a cursor that no longer resolves: start over from the group.
                tracing::debug!(topic = %self.topic, %reason, "subscription fetch failed");
                progress.cursor = None;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                Ok(())
            }
        }
    }

    async fn on_frame(
        &self,
        connection: &mut Connection,
        body: Bytes,
        progress: &mut Progress,
    ) -> std::io::Result<()> {
        let Ok(envelope) = RequestEnvelope::parse(body) else {
            return connection.send(&ResponseFrame::error(0, Reason::MalformedRequest)).await;
        };
        let corr = envelope.corr;
        if !matches!(envelope.key(), Ok(ApiKey::StreamAck)) {
            return connection.send(&ResponseFrame::error(corr, Reason::UnexpectedFrame)).await;
        }
        match envelope.decode().map(|frame| frame.request) {
            Ok(Request::StreamAck(ack)) => {
                self.on_ack(connection, ack, progress).await;
                Ok(())
            }
            _ => connection.send(&ResponseFrame::error(0, Reason::MalformedRequest)).await,
        }
    }

    /// Commits the group at the acked cursor and returns credit. Never answered; failures are
    /// dropped as the original drops them.
    async fn on_ack(
        &self,
        connection: &Connection,
        ack: StreamAckRequest,
        progress: &mut Progress,
    ) {
        let broker = &connection.broker;
        if let (Some(group), Some(cursor)) = (text(&ack.group), ack.cursor.as_deref()) {
            let _ = broker.groups().commit(&self.topic, &group, Some(cursor)).await;
        }
        progress.in_flight -= ack.count.min(progress.in_flight);
        if let (Some(group), Some(member)) = (&self.group, &self.member) {
            broker.groups().heartbeat_member(&self.topic, group, member);
            // With nothing else in flight, re-read the assignment from the committed position.
            let latest = progress.cursor.as_deref().map(str::as_bytes);
            if progress.in_flight == 0 && ack.cursor.as_deref() == latest {
                progress.cursor = None;
            }
        }
    }
}

async fn next_page(
    broker: Arc<Broker>,
    plan: (String, Option<String>, Option<String>, Option<String>, u32),
    credit: u32,
) -> Result<FetchPage, String> {
    let (topic, cursor, group, member, max) = plan;
    let args = FetchArgs {
        topic: &topic,
        cursor: cursor.as_deref().map(str::as_bytes),
        group: group.as_deref(),
        member: member.as_deref(),
        max,
        wait_ms: POLL_WAIT_MS,
        // A push carries at most min(max, window - in_flight) records (section 3.3).
        total_max: Some(credit.min(max).max(1)),
    };
    broker.fetch(&args).await.map_err(|error| error.reason())
}
