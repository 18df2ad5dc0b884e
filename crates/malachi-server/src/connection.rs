//! One client connection: the phases of wire-protocol.md section 1.5.
//!
//! AUTH: the first frame must authenticate, within `auth_timeout_ms`; any failure gets one error
//! frame and the socket closes (one attempt per connection). REQUEST: frames are handled one at a
//! time in arrival order and answered in that order; an idle connection closes after
//! `tcp_recv_timeout`. SUBSCRIBED: after `subscribe`, pushes flow under the credit window and
//! only `stream_ack` is accepted. Nothing a client sends can panic this code: every decode
//! failure is an answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use malachi_broker::node::Broker;
use malachi_broker::produce::Spread;
use malachi_meta::Permission;
use malachi_wire::{ApiKey, FrameCodec, Reason, RequestEnvelope, Response, ResponseFrame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use crate::ServerShared;
use crate::auth;
use crate::limits::{AUTH_FRAME_BYTES_MAX, ConnectionSlot};
use crate::tls::{Accepted, Transport};

/// An authenticated session, fixed at auth time for the connection's life.
#[derive(Clone, Debug)]
pub struct Session {
    pub username: String,
    pub permissions: std::collections::BTreeSet<Permission>,
    /// The user's stored password hash when the session logged in. A password change (or the
    /// account deleted and created again) replaces it with a new salt, which ends the session
    /// at its next request: whoever knew the old password keeps no session.
    pub password_hash: String,
}

impl Session {
    pub fn is_admin(&self) -> bool {
        self.permissions.contains(&Permission::Admin)
    }
}

/// What handling one request produced.
pub enum Outcome {
    Reply(ResponseFrame),
    /// Enter SUBSCRIBED mode.
    Subscribe(crate::subscription::Subscription),
}

/// The two directions of a connection: TCP halves for a real server, the simulator's pipes
/// under simulation. One dynamic call per read or write is noise next to a frame's work.
pub type ConnectionReader = Box<dyn AsyncRead + Send + Sync + Unpin>;
pub type ConnectionWriter = Box<dyn AsyncWrite + Send + Sync + Unpin>;

pub(crate) type Frames = FramedRead<ConnectionReader, FrameCodec>;

pub(crate) struct Connection {
    pub broker: Arc<Broker>,
    pub shared: Arc<ServerShared>,
    pub writer: ConnectionWriter,
    pub session: Session,
    pub spread: Spread,
}

/// Runs a connection accepted on the client port to its end: a slot first (so strangers
/// stalling a TLS handshake count as not logged in), then TLS if the port speaks it.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    broker: Arc<Broker>,
    shared: Arc<ServerShared>,
) {
    let _ = stream.set_nodelay(true);
    let slot = match shared.limits.admit(peer.ip()) {
        Ok(slot) => slot,
        Err(reason) => {
            broker.metrics().refused_for_rate("connection");
            return refuse(&mut stream, reason, &shared).await;
        }
    };
    let (read_half, write_half, transport): (ConnectionReader, ConnectionWriter, Transport) =
        match &shared.tls {
            None => {
                let (read_half, write_half) = stream.into_split();
                (Box::new(read_half), Box::new(write_half), Transport::Plain)
            }
            Some(tls) => {
                let wait = Duration::from_millis(broker.config().auth_timeout_ms);
                let accepted = tokio::select! {
                    biased;
                    // Evicted mid-handshake by a newcomer (limits.rs): nothing to answer on.
                    () = slot.evicted() => return,
                    accepted = tls.accept(stream, wait) => accepted,
                };
                match accepted {
                    Ok(Accepted::Tls(stream, transport)) => {
                        let (read_half, write_half) = tokio::io::split(*stream);
                        (Box::new(read_half), Box::new(write_half), transport)
                    }
                    Ok(Accepted::Plain(mut stream)) if tls.required() => {
                        return refuse(&mut stream, Reason::TlsRequired, &shared).await;
                    }
                    Ok(Accepted::Plain(stream)) => {
                        let (read_half, write_half) = stream.into_split();
                        (Box::new(read_half), Box::new(write_half), Transport::Plain)
                    }
                    Err(error) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                }
            }
        };
    serve_admitted(read_half, write_half, peer, transport, slot, broker, shared).await;
}

/// Answers a connection that will not be served with `reason` on corr 0, and closes it.
async fn refuse<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    reason: Reason,
    shared: &ServerShared,
) {
    let _ = write_frame(writer, &ResponseFrame::error(0, reason), shared).await;
    let _ = writer.shutdown().await;
}

/// Runs a connection given as its two directions (see [`ConnectionReader`]), plain.
pub async fn serve_halves(
    read_half: ConnectionReader,
    mut write_half: ConnectionWriter,
    peer: SocketAddr,
    broker: Arc<Broker>,
    shared: Arc<ServerShared>,
) {
    let slot = match shared.limits.admit(peer.ip()) {
        Ok(slot) => slot,
        Err(reason) => {
            broker.metrics().refused_for_rate("connection");
            return refuse(&mut write_half, reason, &shared).await;
        }
    };
    serve_admitted(read_half, write_half, peer, Transport::Plain, slot, broker, shared).await;
}

async fn serve_admitted(
    read_half: ConnectionReader,
    mut write_half: ConnectionWriter,
    peer: SocketAddr,
    transport: Transport,
    mut slot: ConnectionSlot,
    broker: Arc<Broker>,
    shared: Arc<ServerShared>,
) {
    let _open = broker.metrics().connection_opened();
    let max_frame = broker.config().max_frame_bytes;
    let auth_max_frame = AUTH_FRAME_BYTES_MAX.min(max_frame);
    let mut frames = FramedRead::new(read_half, FrameCodec::new(auth_max_frame));
    let Some(session) =
        auth::authenticate(&mut frames, &mut write_half, peer, &transport, &slot, &broker, &shared)
            .await
    else {
        let _ = write_half.shutdown().await;
        return;
    };
    slot.logged_in();
    frames.decoder_mut().set_max_frame_bytes(max_frame);
    let mut connection =
        Connection { broker, shared, writer: write_half, session, spread: Spread::default() };
    connection.run(frames).await;
}

impl Connection {
    async fn run(&mut self, mut frames: Frames) {
        let idle = Duration::from_millis(self.broker.config().tcp_recv_timeout_ms);
        let mut closing = self.shared.closing.subscribe();
        loop {
            // Biased: a stopping server closes between requests, never inside one.
            let next = tokio::select! {
                biased;
                () = crate::closed(&mut closing) => None,
                next = tokio::time::timeout(idle, frames.next()) => next.ok().flatten(),
            };
            let Some(next) = next else {
                let _ = self.writer.shutdown().await;
                return;
            };
            let body = match next {
                Ok(body) => body,
                Err(error) => {
                    self.fail_frame(error).await;
                    return;
                }
            };
            // Deleting a user (or changing its permissions) revokes its sessions: checked
            // before anything of the request is done.
            if !self.session_alive() {
                let _ = self.send(&ResponseFrame::error(0, Reason::PermissionDenied)).await;
                return;
            }
            let outcome = self.handle(body).await;
            let sent = match outcome {
                Outcome::Reply(frame) => self.send(&frame).await,
                Outcome::Subscribe(subscription) => {
                    subscription.run(self, &mut frames).await;
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }

    /// A frame that could not be read: oversize gets its reason and the connection closes.
    pub(crate) async fn fail_frame(&mut self, error: malachi_wire::FrameError) {
        if let malachi_wire::FrameError::TooLarge(_) = error {
            let _ = self.send(&ResponseFrame::error(0, Reason::FrameTooLarge)).await;
        }
        let _ = self.writer.shutdown().await;
    }

    /// The session's user still exists with the permissions and the password it logged in with.
    pub(crate) fn session_alive(&self) -> bool {
        let session = &self.session;
        self.broker.read_admin(|admin| {
            admin.user(&session.username).is_some_and(|user| {
                user.permissions == session.permissions
                    && user.password_hash == session.password_hash
            })
        })
    }

    async fn handle(&mut self, body: Bytes) -> Outcome {
        let envelope = match RequestEnvelope::parse(body) {
            Ok(envelope) => envelope,
            Err(_) => return Outcome::Reply(ResponseFrame::error(0, Reason::MalformedRequest)),
        };
        let corr = envelope.corr;
        let key = match envelope.key() {
            Ok(key) => key,
            Err(_) => return Outcome::Reply(ResponseFrame::error(corr, Reason::UnknownApiKey)),
        };
        if key.is_auth() || key == ApiKey::StreamAck {
            return Outcome::Reply(ResponseFrame::error(corr, Reason::UnknownApiKey));
        }
        // Admin keys check the permission before decoding (wire-protocol.md section 3.0).
        if key.requires_admin() && !self.session.is_admin() {
            return Outcome::Reply(ResponseFrame::error(corr, Reason::PermissionDenied));
        }
        if crate::dispatch::is_stream_key(key) {
            return Outcome::Reply(ResponseFrame::error(corr, Reason::Unsupported));
        }
        let request = match envelope.decode() {
            Ok(frame) => frame.request,
            Err(error) => return Outcome::Reply(ResponseFrame::error(corr, error.reason())),
        };
        crate::dispatch::dispatch(self, corr, request).await
    }

    pub(crate) async fn send(&mut self, frame: &ResponseFrame) -> std::io::Result<()> {
        write_frame(&mut self.writer, frame, &self.shared).await
    }

    pub(crate) fn reply(corr: u32, response: Response) -> Outcome {
        Outcome::Reply(ResponseFrame::ok(corr, response))
    }

    pub(crate) fn refuse(corr: u32, reason: impl Into<Bytes>) -> Outcome {
        Outcome::Reply(ResponseFrame::error_text(corr, reason))
    }

    /// Who a topic created on this connection counts against (`MALACHI_MAX_TOPICS_PER_USER`);
    /// administrators are exempt.
    pub(crate) fn topic_creator(&self) -> Option<String> {
        (!self.session.is_admin()).then(|| self.session.username.clone())
    }

    /// P(op, topic) of wire-protocol.md section 3.0.
    pub(crate) fn permitted(&self, operation: malachi_meta::Operation, topic: &str) -> bool {
        let strict = self.broker.config().acl_strict;
        let session = &self.session;
        self.broker.read_admin(|admin| {
            admin.allowed(&session.username, &session.permissions, operation, topic, strict)
        })
    }
}

/// Encodes and writes one frame within the send timeout.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    frame: &ResponseFrame,
    shared: &ServerShared,
) -> std::io::Result<()> {
    let mut buffer = BytesMut::new();
    if frame.encode_frame(shared.max_frame_bytes, &mut buffer).is_err() {
        // Pages are bounded below the frame limit; this is a bug, answered rather than hidden.
        buffer.clear();
        ResponseFrame::error_text(frame.corr, "response_too_large")
            .encode_frame(shared.max_frame_bytes, &mut buffer)
            .expect("an error frame fits");
    }
    match tokio::time::timeout(shared.send_timeout, writer.write_all(&buffer)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "send timed out")),
    }
}
