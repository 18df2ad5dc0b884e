//! Malachi's client-protocol server: accepts TCP connections on the client port, runs each
//! connection through the phases of the wire protocol (auth, requests, subscription), checks
//! permissions, and calls the log API. It owns sessions and connection limits; it never touches
//! storage or metadata except through `malachi-broker`.

mod auth;
mod connection;
mod convert;
mod dispatch;
mod extensions;
pub mod jwt;
mod limits;
pub mod lockouts;
mod members;
mod password;
mod policies;
pub mod quota;
mod subscription;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_broker::auth::AuthRateLimiter;
use malachi_broker::node::Broker;
use tokio::net::TcpListener;

pub use auth::password_login;
pub use connection::{ConnectionReader, ConnectionWriter, Session, serve_halves};
pub use limits::ConnectionLimits;

/// State every connection of one server shares.
#[derive(Debug)]
pub struct ServerShared {
    pub limits: Arc<ConnectionLimits>,
    pub auth_rate: Mutex<AuthRateLimiter>,
    pub max_frame_bytes: u32,
    pub send_timeout: Duration,
    /// Argon2 for logins, off the storage pool, with a bounded queue.
    pub passwords: password::PasswordPool,
    /// TLS on the client port, if enabled.
    pub tls: Option<tls::TlsListener>,
    /// Token login (key 13), if enabled.
    pub tokens: Option<jwt::TokenVerifier>,
    /// Per-user publish and subscribe quotas.
    pub quotas: quota::Quotas,
    /// Failed logins, written to the administrative group in batches.
    pub lockouts: lockouts::LockoutBatcher,
    /// Set when the server stops: each connection closes once its request in hand is answered.
    pub closing: malachi_consensus::watch::Sender<bool>,
}

impl ServerShared {
    /// The shared state for the connections of `broker`'s client port, from its configuration.
    /// Fails only if TLS is on and its files do not load.
    pub fn for_broker(broker: &Broker) -> Result<Arc<ServerShared>, tls::TlsError> {
        let config = broker.config();
        let tls = config.security.tls.clone().map(tls::TlsListener::load).transpose()?;
        let tokens = config.security.oidc.clone().map(jwt::TokenVerifier::new);
        Ok(Arc::new(ServerShared {
            limits: ConnectionLimits::new(
                config.connection_limit_enabled,
                (config.max_conn_per_ip, config.max_total_conn),
                config.max_unauthenticated_conn,
            ),
            auth_rate: Mutex::new(AuthRateLimiter::new(
                config.auth_rate_limit,
                config.auth_rate_window_ms,
            )),
            max_frame_bytes: config.max_frame_bytes,
            send_timeout: Duration::from_millis(config.tcp_send_timeout_ms),
            passwords: password::PasswordPool::new(broker.data_plane().io_mode()),
            tls,
            tokens,
            quotas: quota::Quotas::new(&config.security),
            lockouts: lockouts::LockoutBatcher::default(),
            closing: malachi_consensus::watch::channel(false).0,
        }))
    }
}

/// Resolves once the server is stopping ([`ServerShared::closing`]).
pub(crate) async fn closed(closing: &mut malachi_consensus::watch::Receiver<bool>) {
    while !*closing.borrow() {
        // An error means the sender is gone: the server is gone, so is every reason to wait.
        if closing.changed().await.is_err() {
            return;
        }
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    broker: Arc<Broker>,
    shared: Arc<ServerShared>,
}

impl Server {
    /// Binds the client port of `broker`'s configuration (port 0 picks a free one).
    pub async fn bind(broker: Arc<Broker>) -> std::io::Result<Server> {
        let config = broker.config();
        let shared = ServerShared::for_broker(&broker).map_err(std::io::Error::other)?;
        let listener = TcpListener::bind((config.bind_address.as_str(), config.tcp_port)).await?;
        Ok(Server { listener, broker, shared })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The state its connections share (the console logs users in through it too).
    pub fn shared(&self) -> &Arc<ServerShared> {
        &self.shared
    }

    /// Accepts connections until `shutdown` completes, then waits up to the configured grace
    /// for open connections to finish.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let Server { listener, broker, shared } = self;
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let broker = Arc::clone(&broker);
                        let shared = Arc::clone(&shared);
                        connections.spawn(connection::serve(stream, peer, broker, shared));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        // New connections are refused (a client tries another broker at once), and open ones
        // close as soon as the request each is serving is answered.
        drop(listener);
        shared.closing.send_modify(|closing| *closing = true);
        let grace = Duration::from_millis(broker.config().shutdown_grace_ms);
        let drained =
            tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} })
                .await;
        if drained.is_err() {
            connections.abort_all();
        }
    }
}
