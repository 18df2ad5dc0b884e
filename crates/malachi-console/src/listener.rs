//! The HTTP port's connections. With TLS on the client port (`MALACHI_ENABLE_TLS`), the HTTP
//! port speaks HTTPS with the same certificate, reloaded the same way, and keeps answering plain
//! HTTP unless `MALACHI_REQUIRE_TLS`, exactly as the client port does: a Prometheus scraper or a
//! load balancer's health check on plain HTTP keeps working until the operator requires TLS.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use malachi_server::ServerShared;
use malachi_server::tls::Accepted;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

/// A connection must finish its TLS handshake within this.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; a connection beyond them is closed at once, so a crowd of
/// slow strangers cannot hold the port's memory.
const HANDSHAKES_MAX: usize = 256;
/// Connections accepted and handshaken but not yet taken by the HTTP server.
const READY_MAX: usize = 64;

/// Who is on the other end of a request.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub address: SocketAddr,
    /// The connection speaks TLS, so cookies set over it are `Secure`.
    pub tls: bool,
}

pub(crate) type Connection = Either<TcpStream, TlsStream<TcpStream>>;

/// Accepts on the HTTP port and hands axum connections that are ready for HTTP.
pub(crate) struct HttpListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Connection, Peer)>,
}

impl HttpListener {
    /// Starts accepting on `tcp`; TLS as the client port is configured in `shared`.
    pub(crate) fn start(tcp: TcpListener, shared: Arc<ServerShared>) -> io::Result<HttpListener> {
        let local = tcp.local_addr()?;
        let (sender, ready) = mpsc::channel(READY_MAX);
        tokio::spawn(accept_loop(tcp, shared, sender));
        Ok(HttpListener { local, ready })
    }
}

impl Listener for HttpListener {
    type Io = Connection;
    type Addr = Peer;

    async fn accept(&mut self) -> (Connection, Peer) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended (its socket failed for good): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        Ok(Peer { address: self.local, tls: false })
    }
}

impl Connected<IncomingStream<'_, HttpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, HttpListener>) -> Peer {
        *stream.remote_addr()
    }
}

async fn accept_loop(
    tcp: TcpListener,
    shared: Arc<ServerShared>,
    ready: mpsc::Sender<(Connection, Peer)>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let accepted = tokio::select! {
            _ = ready.closed() => return,
            accepted = tcp.accept() => accepted,
        };
        let (stream, address) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(%error, "the HTTP port could not accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.tls.is_none() {
            let plain = (Either::Left(stream), Peer { address, tls: false });
            if ready.send(plain).await.is_err() {
                return;
            }
            continue;
        }
        let Ok(permit) = handshakes.clone().try_acquire_owned() else { continue };
        let (shared, ready) = (shared.clone(), ready.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(connection) = handshake(&shared, stream, address).await {
                let _ = ready.send(connection).await;
            }
        });
    }
}

/// The connection once it is ready for HTTP: TLS completed, or plain when plain is allowed.
async fn handshake(
    shared: &ServerShared,
    stream: TcpStream,
    address: SocketAddr,
) -> Option<(Connection, Peer)> {
    let tls = shared.tls.as_ref()?;
    match tls.accept(stream, HANDSHAKE_WAIT).await {
        Ok(Accepted::Tls(stream, _)) => Some((Either::Right(*stream), Peer { address, tls: true })),
        Ok(Accepted::Plain(stream)) if !tls.required() => {
            Some((Either::Left(stream), Peer { address, tls: false }))
        }
        Ok(Accepted::Plain(_)) => {
            tracing::debug!(%address, "plain HTTP refused: MALACHI_REQUIRE_TLS");
            None
        }
        Err(error) => {
            tracing::debug!(%address, %error, "HTTP port handshake failed");
            None
        }
    }
}
