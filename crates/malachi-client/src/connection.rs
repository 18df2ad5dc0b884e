//! One TCP connection carrying many requests at once.
//!
//! Callers never touch the socket. A call takes the next `corr`, registers a waiter under it,
//! encodes its frame and hands the bytes to the writer task; the reader task splits incoming
//! frames, finds the waiter by `corr` and hands it the decoded answer. Answers may come in any
//! order (section 1.3 allows it); only the `corr` matches them.
//!
//! * `corr` starts at 1, wraps from `u32::MAX` back to 1 and skips 0 and any `corr` still
//!   waiting for its answer.
//! * `corr` 0 is the server's voice for the connection as a whole (connection limits, an
//!   oversize frame, an envelope it could not read). Such an error is remembered: if the server
//!   then closes, every waiter gets that reason instead of a bare "closed".
//! * Frames for a `corr` nobody waits for (a call that timed out, say) are dropped, as the Node
//!   client does.
//! * When the connection ends, every waiter gets the cause, and every later call gets it at
//!   once: a connection is never reopened behind the caller's back.
//!
//! Bounds: the outgoing queue holds [`OUTGOING_FRAMES_MAX`] frames (a caller waits when it is
//! full), a subscription buffers [`PUSHES_BUFFERED_MAX`] pushes (the server's window bounds
//! them too), and incoming frames are refused over the configured frame limit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use malachi_wire::messages::FetchResponse;
use malachi_wire::response::Expect;
use malachi_wire::{
    ApiKey, Request, RequestFrame, Response, ResponseBody, ResponseEnvelope, split_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::{ClientError, CloseCause};

/// Frames queued for the writer task before callers wait.
pub(crate) const OUTGOING_FRAMES_MAX: usize = 1024;
/// Pushes a subscription holds before the reader task waits for the consumer.
pub(crate) const PUSHES_BUFFERED_MAX: usize = 64;
/// Bytes the writer gathers from the queue into one write.
const WRITE_GATHER_BYTES_MAX: usize = 256 * 1024;
/// Bytes the reader asks the socket for at a time (more if a frame needs it).
const READ_CHUNK_BYTES: usize = 64 * 1024;

pub(crate) type Push = Result<FetchResponse, ClientError>;

/// A connection's handle. Dropping it stops the reader and lets the writer flush and close.
#[derive(Debug)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
    outgoing: mpsc::Sender<Bytes>,
    reader: JoinHandle<()>,
    max_frame_bytes: u32,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    next_corr: u32,
    /// Ordered, so that a closing connection fails its waiters in one reproducible order.
    waiters: BTreeMap<u32, Waiter>,
    /// The last error the server sent on `corr` 0.
    connection_error: Option<Vec<u8>>,
    closed: Option<CloseCause>,
}

/// The two directions of a connection to a broker: TCP halves, or the simulator's pipes.
pub type StreamReader = Box<dyn AsyncRead + Send + Sync + Unpin>;
pub type StreamWriter = Box<dyn AsyncWrite + Send + Sync + Unpin>;

#[derive(Debug)]
enum Waiter {
    /// One answer to a request with this key.
    Reply { api_key: ApiKey, sender: oneshot::Sender<Result<Response, ClientError>> },
    /// Every ok frame on this `corr` is a push of the subscription; an error ends it.
    Pushes { sender: mpsc::Sender<Push> },
}

impl Connection {
    pub(crate) fn start(
        read: StreamReader,
        write: StreamWriter,
        max_frame_bytes: u32,
    ) -> Connection {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_corr: 1,
                waiters: BTreeMap::new(),
                connection_error: None,
                closed: None,
            }),
        });
        let (outgoing, queue) = mpsc::channel(OUTGOING_FRAMES_MAX);
        tokio::spawn(write_loop(write, queue, Arc::clone(&shared)));
        let reader = tokio::spawn(read_loop(read, Arc::clone(&shared), max_frame_bytes));
        Connection { shared, outgoing, reader, max_frame_bytes }
    }

    /// Sends `request` and waits at most `timeout` for its answer.
    pub(crate) async fn call(
        &self,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let api_key = request.api_key();
        let (sender, receiver) = oneshot::channel();
        let corr = self.register(Waiter::Reply { api_key, sender })?;
        let guard = WaiterGuard { shared: &self.shared, corr };
        let exchange = async {
            self.send(corr, request).await?;
            match receiver.await {
                Ok(answer) => answer,
                Err(_) => Err(self.close_cause().to_error()),
            }
        };
        let answer = tokio::time::timeout(timeout, exchange).await;
        drop(guard);
        answer.unwrap_or(Err(ClientError::Timeout))
    }

    /// Sends a request that gets no answer (`stream_ack`).
    pub(crate) async fn send_unanswered(&self, request: Request) -> Result<(), ClientError> {
        let corr = {
            let mut state = self.shared.lock();
            if let Some(cause) = &state.closed {
                return Err(cause.to_error());
            }
            state.take_corr()
        };
        self.send(corr, request).await
    }

    /// Sends `subscribe` and returns the channel its pushes (or its refusal) arrive on.
    pub(crate) async fn open_pushes(
        &self,
        request: Request,
    ) -> Result<mpsc::Receiver<Push>, ClientError> {
        let (sender, receiver) = mpsc::channel(PUSHES_BUFFERED_MAX);
        let corr = self.register(Waiter::Pushes { sender })?;
        if let Err(error) = self.send(corr, request).await {
            self.shared.lock().waiters.remove(&corr);
            return Err(error);
        }
        Ok(receiver)
    }

    /// Why the connection ended, or [`CloseCause::Closed`] if it has not (yet).
    pub(crate) fn close_cause(&self) -> CloseCause {
        self.shared.lock().closed.clone().unwrap_or(CloseCause::Closed)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    #[cfg(test)]
    pub(crate) fn set_next_corr(&self, corr: u32) {
        self.shared.lock().next_corr = corr;
    }

    fn register(&self, waiter: Waiter) -> Result<u32, ClientError> {
        let mut state = self.shared.lock();
        if let Some(cause) = &state.closed {
            return Err(cause.to_error());
        }
        let corr = state.take_corr();
        state.waiters.insert(corr, waiter);
        Ok(corr)
    }

    async fn send(&self, corr: u32, request: Request) -> Result<(), ClientError> {
        let mut frame = BytesMut::new();
        RequestFrame::new(corr, request).encode_frame(self.max_frame_bytes, &mut frame).map_err(
            |error| ClientError::Protocol(format!("cannot encode the request: {error}")),
        )?;
        self.outgoing.send(frame.freeze()).await.map_err(|_| self.close_cause().to_error())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.close(CloseCause::Closed);
    }
}

/// Removes a waiter whose call ended early (timeout, or the caller's future dropped), so a late
/// answer finds nobody and is dropped.
struct WaiterGuard<'a> {
    shared: &'a Shared,
    corr: u32,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().waiters.remove(&self.corr);
    }
}

impl State {
    /// The next free `corr`: never 0, never one still waiting for its answer.
    fn take_corr(&mut self) -> u32 {
        loop {
            let corr = self.next_corr;
            self.next_corr = if corr == u32::MAX { 1 } else { corr + 1 };
            if corr != 0 && !self.waiters.contains_key(&corr) {
                return corr;
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, still consistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends the connection once: every waiter gets the cause, later calls too.
    fn close(&self, cause: CloseCause) {
        let (cause, waiters) = {
            let mut state = self.lock();
            if state.closed.is_some() {
                return;
            }
            // A server that said why (corr 0) before the socket ended is the better answer
            // than the end itself, whether a clean close or a reset.
            let cause = match (cause, &state.connection_error) {
                (CloseCause::Closed | CloseCause::Transport { .. }, Some(reason)) => {
                    CloseCause::Server(reason.clone())
                }
                (cause, _) => cause,
            };
            state.closed = Some(cause.clone());
            (cause, std::mem::take(&mut state.waiters))
        };
        for (_, waiter) in waiters {
            match waiter {
                Waiter::Reply { sender, .. } => {
                    let _ = sender.send(Err(cause.to_error()));
                }
                Waiter::Pushes { sender } => {
                    let _ = sender.try_send(Err(cause.to_error()));
                }
            }
        }
    }
}

async fn write_loop(
    mut write: StreamWriter,
    mut queue: mpsc::Receiver<Bytes>,
    shared: Arc<Shared>,
) {
    let mut gathered = BytesMut::new();
    while let Some(frame) = queue.recv().await {
        gathered.extend_from_slice(&frame);
        while gathered.len() < WRITE_GATHER_BYTES_MAX {
            match queue.try_recv() {
                Ok(frame) => gathered.extend_from_slice(&frame),
                Err(_) => break,
            }
        }
        if let Err(error) = write.write_all(&gathered).await {
            shared.close(CloseCause::transport(&error));
            return;
        }
        gathered.clear();
    }
    let _ = write.shutdown().await;
}

async fn read_loop(mut read: StreamReader, shared: Arc<Shared>, max_frame_bytes: u32) {
    let cause = match read_frames(&mut read, &shared, max_frame_bytes).await {
        Ok(()) => CloseCause::Closed,
        Err(cause) => cause,
    };
    shared.close(cause);
}

/// Reads until the server closes (`Ok`) or something fails.
async fn read_frames(
    read: &mut StreamReader,
    shared: &Shared,
    max_frame_bytes: u32,
) -> Result<(), CloseCause> {
    let mut buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
    loop {
        loop {
            let body = split_frame(&mut buffer, max_frame_bytes).map_err(|error| {
                CloseCause::Protocol(format!("the server sent an oversize frame: {error}"))
            })?;
            let Some(body) = body else { break };
            deliver(shared, body).await?;
        }
        buffer.reserve(READ_CHUNK_BYTES);
        let read_bytes = read.read_buf(&mut buffer).await.map_err(|e| CloseCause::transport(&e))?;
        if read_bytes == 0 {
            return Ok(());
        }
    }
}

/// Hands one frame to its waiter.
async fn deliver(shared: &Shared, body: Bytes) -> Result<(), CloseCause> {
    let envelope = ResponseEnvelope::parse(body)
        .map_err(|error| CloseCause::Protocol(format!("unreadable response: {error}")))?;
    if envelope.corr == 0 {
        remember_connection_error(shared, envelope);
        return Ok(());
    }
    let waiter = {
        let mut state = shared.lock();
        match state.waiters.get(&envelope.corr) {
            None => {
                tracing::debug!(corr = envelope.corr, "dropping an answer nobody waits for");
                return Ok(());
            }
            Some(Waiter::Pushes { sender }) if !envelope.is_error() => {
                Waiter::Pushes { sender: sender.clone() }
            }
            Some(_) => state.waiters.remove(&envelope.corr).expect("present under the lock"),
        }
    };
    match waiter {
        Waiter::Reply { api_key, sender } => {
            let _ = sender.send(decode_reply(envelope, api_key));
        }
        Waiter::Pushes { sender } => {
            let push =
                decode_reply(envelope, ApiKey::Subscribe).and_then(|response| match response {
                    Response::Subscribe(push) => Ok(push),
                    other => Err(ClientError::Protocol(format!("unexpected push {other:?}"))),
                });
            // The subscriber may have gone; the connection goes with it soon.
            let _ = sender.send(push).await;
        }
    }
    Ok(())
}

fn remember_connection_error(shared: &Shared, envelope: ResponseEnvelope) {
    if !envelope.is_error() {
        tracing::debug!("dropping an ok frame on corr 0");
        return;
    }
    let reason = match envelope.decode(Expect::Reply(ApiKey::Auth)) {
        Ok(frame) => match frame.body {
            ResponseBody::Error { reason } => reason.to_vec(),
            _ => b"unreadable connection error".to_vec(),
        },
        Err(_) => b"unreadable connection error".to_vec(),
    };
    let text = String::from_utf8_lossy(&reason);
    tracing::warn!(reason = %text, "the server reported a connection error");
    shared.lock().connection_error = Some(reason);
}

fn decode_reply(envelope: ResponseEnvelope, api_key: ApiKey) -> Result<Response, ClientError> {
    let frame = envelope
        .decode(Expect::Reply(api_key))
        .map_err(|error| ClientError::Protocol(format!("{api_key} answer: {error}")))?;
    match frame.body {
        ResponseBody::Ok(response) => Ok(response),
        ResponseBody::Error { reason } => Err(ClientError::server(&reason)),
        ResponseBody::Push(_) => Err(ClientError::Protocol(format!("{api_key} answer is a push"))),
    }
}
