//! A scripted server for the client's tests: a `TcpListener` on 127.0.0.1 whose every accepted
//! connection runs a test-supplied script over typed frames (malachi-wire on both sides).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use malachi_wire::limits::FRAME_BYTES_MAX_DEFAULT;
use malachi_wire::messages::TokenResponse;
use malachi_wire::{Request, RequestFrame, Response, ResponseFrame, split_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub(crate) struct FakeServer {
    pub(crate) address: String,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// One accepted connection, driven by the script.
pub(crate) struct FakeConnection {
    stream: TcpStream,
    buffer: BytesMut,
}

impl FakeServer {
    pub(crate) async fn start<Script, Run>(script: Script) -> FakeServer
    where
        Script: Fn(FakeConnection) -> Run + Send + Sync + 'static,
        Run: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds on loopback");
        let address: SocketAddr = listener.local_addr().expect("has an address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(script(FakeConnection { stream, buffer: BytesMut::new() }));
            }
        });
        FakeServer { address: address.to_string(), accepted, task }
    }

    pub(crate) fn connections_accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeConnection {
    /// The next request, or `None` once the client closed.
    pub(crate) async fn recv(&mut self) -> Option<RequestFrame> {
        loop {
            let split = split_frame(&mut self.buffer, FRAME_BYTES_MAX_DEFAULT);
            if let Some(body) = split.expect("the client keeps to the frame limit") {
                return Some(RequestFrame::decode(body).expect("the client sends valid requests"));
            }
            let read = self.stream.read_buf(&mut self.buffer).await.unwrap_or(0);
            if read == 0 {
                return None;
            }
        }
    }

    pub(crate) async fn send(&mut self, frame: ResponseFrame) {
        let mut bytes = BytesMut::new();
        frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut bytes).expect("encodes");
        self.stream.write_all(&bytes).await.expect("the client is listening");
    }

    pub(crate) async fn reply(&mut self, corr: u32, response: Response) {
        self.send(ResponseFrame::ok(corr, response)).await;
    }

    pub(crate) async fn refuse(&mut self, corr: u32, reason: &'static str) {
        self.send(ResponseFrame::error_text(corr, Bytes::from_static(reason.as_bytes()))).await;
    }

    /// Expects a login as the first frame and accepts it.
    pub(crate) async fn accept_login(&mut self) {
        let frame = self.recv().await.expect("a login");
        assert!(matches!(frame.request, Request::Auth(_)), "first frame is auth: {frame:?}");
        let token = Some(Bytes::from_static(b"tok_abc"));
        self.reply(frame.corr, Response::Auth(TokenResponse { token })).await;
    }
}
