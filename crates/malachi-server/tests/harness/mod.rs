//! A broker and server on a free port in this process, and a raw wire client, for tests that
//! cross a real socket.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use malachi_broker::node::Broker;
use malachi_broker::testing;
use malachi_server::Server;
use malachi_wire::messages::AuthRequest;
use malachi_wire::{
    Expect, Request, RequestFrame, ResponseBody, ResponseEnvelope, ResponseFrame, split_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct TestServer {
    pub address: SocketAddr,
    pub broker: Arc<Broker>,
    /// Dropping it stops the server.
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// Starts a broker with the test accounts of wire-protocol.md section 5.9 and `settings`.
pub async fn start(settings: &[(&str, &str)]) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let seed_users =
        "producer:producer123:produce;consumer:consumer123:consume;app:app123:produce,consume";
    // The spec's accounts have six-character passwords, below the default minimum of 12.
    let mut all: Vec<(&str, &str)> =
        vec![("TCP_PORT", "0"), ("DEFAULT_USERS", seed_users), ("MIN_PASSWORD_LEN", "6")];
    all.extend_from_slice(settings);
    let broker = testing::open(testing::config(dir.path(), &all)).await;
    let server = Server::bind(Arc::clone(&broker)).await.unwrap();
    let address = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    TestServer { address, broker, _stop: stop, _dir: dir }
}

/// A raw protocol client: frames in, frames out, nothing hidden.
pub struct WireClient {
    stream: TcpStream,
    buffer: BytesMut,
    next_corr: u32,
}

impl WireClient {
    pub async fn connect(address: SocketAddr) -> WireClient {
        WireClient {
            stream: TcpStream::connect(address).await.unwrap(),
            buffer: BytesMut::new(),
            next_corr: 1,
        }
    }

    /// Connects and authenticates; panics if the login fails.
    pub async fn login(address: SocketAddr, user: &str, password: &str) -> WireClient {
        let mut client = WireClient::connect(address).await;
        let answer = client.call(auth(user, password)).await.expect("answer");
        assert!(matches!(answer.body, ResponseBody::Ok(_)), "login of {user}: {answer:?}");
        client
    }

    pub async fn send(&mut self, request: Request) -> u32 {
        let corr = self.next_corr;
        self.next_corr += 1;
        let mut bytes = BytesMut::new();
        RequestFrame::new(corr, request).encode_frame(16 * 1024 * 1024, &mut bytes).unwrap();
        self.stream.write_all(&bytes).await.unwrap();
        corr
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    /// The next frame, decoded as an answer to `key`; `None` once the server closed.
    pub async fn recv(&mut self, expect: Expect) -> Option<ResponseFrame> {
        let body = self.recv_body().await?;
        Some(ResponseEnvelope::parse(body).unwrap().decode(expect).unwrap())
    }

    pub async fn recv_body(&mut self) -> Option<Bytes> {
        loop {
            if let Some(body) = split_frame(&mut self.buffer, 16 * 1024 * 1024).unwrap() {
                return Some(body);
            }
            let read = tokio::time::timeout(
                Duration::from_secs(20),
                self.stream.read_buf(&mut self.buffer),
            )
            .await
            .expect("the server answered within 20 s");
            if read.unwrap_or(0) == 0 {
                return None;
            }
        }
    }

    pub async fn call(&mut self, request: Request) -> Option<ResponseFrame> {
        let key = request.api_key();
        let corr = self.send(request).await;
        let answer = self.recv(Expect::Reply(key)).await?;
        assert_eq!(answer.corr, corr);
        Some(answer)
    }

    /// True when the server has closed the connection (reads end).
    pub async fn is_closed(&mut self) -> bool {
        self.recv_body().await.is_none()
    }
}

pub fn auth(user: &str, password: &str) -> Request {
    Request::Auth(AuthRequest {
        username: Some(Bytes::from(user.to_string())),
        password: Some(Bytes::from(password.to_string())),
    })
}

pub fn text(value: &str) -> Option<Bytes> {
    Some(Bytes::from(value.to_string()))
}

/// The reason of an error answer.
pub fn reason(frame: &ResponseFrame) -> String {
    match &frame.body {
        ResponseBody::Error { reason } => String::from_utf8_lossy(reason).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    }
}
