//! The AUTH phase (wire-protocol.md section 5): one attempt, then either a session or a closed
//! socket. A password login (key 0) checks, in order: account lockout for (username, address),
//! the per-address rate limit, the credentials. An unknown user and a wrong password get the
//! same answer after the same Argon2id work. A certificate login (key 12) and a token login
//! (key 13) first check that the method is on and usable here, then the rate limit, then map
//! the certificate's or token's identity to an existing user.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use malachi_broker::auth::new_token;
use malachi_broker::node::Broker;
use malachi_meta::AdminCommand;
use malachi_wire::messages::{AuthRequest, TokenResponse};
use malachi_wire::{ApiKey, Reason, Request, RequestEnvelope, Response, ResponseFrame};

use crate::ServerShared;
use crate::connection::{Frames, Session, write_frame};
use crate::convert::text;
use crate::jwt::TokenRefusal;
use crate::limits::ConnectionSlot;
use crate::tls::Transport;

/// Reads and answers the first frame; `Some` only for a successful login.
pub(crate) async fn authenticate(
    frames: &mut Frames,
    writer: &mut crate::connection::ConnectionWriter,
    peer: SocketAddr,
    transport: &Transport,
    slot: &ConnectionSlot,
    broker: &Arc<Broker>,
    shared: &ServerShared,
) -> Option<Session> {
    let wait = Duration::from_millis(broker.config().auth_timeout_ms);
    // Until its first frame is whole, a newcomer may evict this connection (limits.rs).
    // Eviction first: an evicted slot has already given up its place.
    let next = tokio::select! {
        biased;
        () = slot.evicted() => {
            let _ = write_frame(writer, &ResponseFrame::error(0, Reason::Overloaded), shared).await;
            return None;
        }
        next = tokio::time::timeout(wait, frames.next()) => next,
    };
    let body = match next {
        Ok(Some(Ok(body))) => body,
        Ok(Some(Err(malachi_wire::FrameError::TooLarge(_)))) => {
            let _ =
                write_frame(writer, &ResponseFrame::error(0, Reason::FrameTooLarge), shared).await;
            return None;
        }
        _ => return None,
    };
    slot.heard();
    let login = Login { peer, transport, broker, shared };
    let (corr, outcome) = login.first_frame(body).await;
    let answer = match &outcome {
        Ok((_, token)) => ResponseFrame::ok(
            corr,
            Response::Auth(TokenResponse { token: Some(token.clone().into()) }),
        ),
        Err(reason) => ResponseFrame::error(corr, *reason),
    };
    let sent = write_frame(writer, &answer, shared).await;
    match (outcome, sent) {
        (Ok((session, _)), Ok(())) => Some(session),
        _ => None,
    }
}

/// A password login from outside the client port (the console's login form): the same checks
/// in the same order as key 0 (lockout, the per-address rate limit, Argon2id on the server's
/// password threads), recorded the same way (failures towards a lockout, the login metric).
pub async fn password_login(
    broker: &Arc<Broker>,
    shared: &ServerShared,
    peer: SocketAddr,
    username: &str,
    password: &str,
) -> Result<Session, Reason> {
    let login = Login { peer, transport: &Transport::Plain, broker, shared };
    let request = AuthRequest {
        username: Some(bytes::Bytes::copy_from_slice(username.as_bytes())),
        password: Some(bytes::Bytes::copy_from_slice(password.as_bytes())),
    };
    let outcome = login.password(&request).await;
    let counted = outcome.as_ref().map_or_else(|reason| reason.as_str(), |_| "ok");
    broker.metrics().login("console", counted);
    outcome.map(|(session, _)| session)
}

/// One login attempt's context.
struct Login<'a> {
    peer: SocketAddr,
    transport: &'a Transport,
    broker: &'a Arc<Broker>,
    shared: &'a ServerShared,
}

type Outcome = Result<(Session, String), Reason>;

impl Login<'_> {
    /// Decodes the first frame and tries it: the corr to answer on, and a session or a reason.
    async fn first_frame(&self, body: bytes::Bytes) -> (u32, Outcome) {
        let Ok(envelope) = RequestEnvelope::parse(body) else {
            return (0, Err(Reason::AuthRequired));
        };
        let corr = envelope.corr;
        if !envelope.key().is_ok_and(ApiKey::is_auth) {
            return (corr, Err(Reason::AuthRequired));
        }
        let Ok(frame) = envelope.decode() else {
            return (0, Err(Reason::AuthRequired));
        };
        let (method, outcome) = match frame.request {
            Request::Auth(request) => ("password", self.password(&request).await),
            Request::MtlsAuth(_) => ("certificate", self.certificate()),
            Request::TokenAuth(request) => ("token", self.token(&request.jwt)),
            _ => return (corr, Err(Reason::AuthRequired)),
        };
        let counted = outcome.as_ref().map_or_else(|reason| reason.as_str(), |_| "ok");
        self.broker.metrics().login(method, counted);
        (corr, outcome)
    }

    async fn password(&self, request: &AuthRequest) -> Outcome {
        let (peer, broker, shared) = (self.peer, self.broker, self.shared);
        let username = text(&request.username).unwrap_or_default();
        let password = text(&request.password).unwrap_or_default();
        let address = peer.ip().to_string();
        let now_ms = broker.clock().now_ms();
        let locked = broker.read_admin(|admin| admin.locked_until(&username, &address, now_ms));
        if locked.is_some() {
            return Err(Reason::AccountLocked);
        }
        let attempt = self.count_attempt(now_ms)?;
        let stored = broker.read_admin(|admin| {
            admin.user(&username).map(|user| (user.password_hash.clone(), user.permissions.clone()))
        });
        let hash = stored.as_ref().map(|(hash, _)| hash.clone());
        // On the server's own Argon2 threads; a full queue is `overloaded`, judged nothing.
        let matches = match shared.passwords.verify(hash, password).await {
            Ok(matches) => matches,
            Err(reason) => {
                attempt.refund();
                return Err(reason);
            }
        };
        let Some((password_hash, permissions)) = stored.filter(|_| matches) else {
            shared.lockouts.record(broker, username, address).await;
            return Err(Reason::InvalidCredentials);
        };
        attempt.refund();
        let had_failures =
            broker.read_admin(|admin| admin.lockout_entry(&username, &address).is_some());
        if had_failures {
            let success = AdminCommand::RecordLoginSuccess { username: username.clone(), address };
            let _ = broker.admin_command(success).await;
        }
        let session = Session { username, permissions, password_hash };
        Ok((session, new_token(&**broker.entropy())))
    }

    /// Key 12: the user the verified client certificate names.
    fn certificate(&self) -> Outcome {
        let mtls = &self.broker.config().security.mtls;
        if !mtls.enabled {
            return Err(Reason::MtlsAuthDisabled);
        }
        let verifying = self.shared.tls.as_ref().is_some_and(|tls| tls.verifies_peers());
        let Transport::Tls { client_certificate } = self.transport else {
            return Err(Reason::MtlsAuthUnavailable);
        };
        if !verifying {
            return Err(Reason::MtlsAuthUnavailable);
        }
        let certificate = client_certificate.as_ref().ok_or(Reason::NoPeerCertificate)?;
        let attempt = self.count_attempt(self.broker.clock().now_ms())?;
        let identity = crate::tls::certificate_identity(certificate, mtls.policy);
        let Some(identity) = identity else {
            tracing::info!(peer = %self.peer, policy = ?mtls.policy, "certificate login: the certificate names no user");
            return Err(Reason::InvalidCredentials);
        };
        self.known_user(identity, attempt)
    }

    /// Key 13: the user a valid token names.
    fn token(&self, jwt: &Option<bytes::Bytes>) -> Outcome {
        let Some(verifier) = &self.shared.tokens else {
            return Err(Reason::OidcAuthDisabled);
        };
        let now_ms = self.broker.clock().now_ms();
        let attempt = self.count_attempt(now_ms)?;
        let jwt = text(jwt).unwrap_or_default();
        match verifier.verify(&jwt, now_ms) {
            Ok(identity) => self.known_user(identity, attempt),
            Err(TokenRefusal::Misconfigured) => {
                attempt.refund();
                Err(Reason::OidcMisconfigured)
            }
            Err(TokenRefusal::Invalid(problem)) => {
                tracing::info!(peer = %self.peer, %problem, "token login refused");
                Err(Reason::InvalidCredentials)
            }
        }
    }

    /// A session for `username` with its stored permissions, if the user exists.
    fn known_user(&self, username: String, attempt: Attempt<'_>) -> Outcome {
        let stored = self.broker.read_admin(|admin| {
            admin.user(&username).map(|user| (user.permissions.clone(), user.password_hash.clone()))
        });
        let Some((permissions, password_hash)) = stored else {
            tracing::info!(peer = %self.peer, user = %username, "login names no provisioned user");
            return Err(Reason::InvalidCredentials);
        };
        attempt.refund();
        let session = Session { username, permissions, password_hash };
        Ok((session, new_token(&**self.broker.entropy())))
    }

    /// Counts this login against the per-address rate limit now, in the same step as the check:
    /// it stays counted as a failure unless refunded, so concurrent guesses cannot all pass
    /// before one is counted.
    fn count_attempt(&self, now_ms: u64) -> Result<Attempt<'_>, Reason> {
        if !self.broker.config().rate_limit_enabled {
            return Ok(Attempt { shared: self.shared, attempt: None });
        }
        let mut limiter = self.shared.auth_rate.lock().expect("rate limiter lock poisoned");
        let attempt =
            limiter.begin(self.peer.ip(), now_ms).map_err(|_| Reason::RateLimitExceeded)?;
        Ok(Attempt { shared: self.shared, attempt: Some(attempt) })
    }
}

/// A counted login attempt; [`Attempt::refund`] takes it back (success, or never judged).
struct Attempt<'a> {
    shared: &'a ServerShared,
    attempt: Option<malachi_broker::auth::LoginAttempt>,
}

impl Attempt<'_> {
    fn refund(self) {
        if let Some(attempt) = self.attempt {
            self.shared.auth_rate.lock().expect("rate limiter lock poisoned").refund(attempt);
        }
    }
}
