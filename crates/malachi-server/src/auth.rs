//! The AUTH phase (wire-protocol.md section 5): one attempt, then either a session or a closed
//! socket. Checks in order: account lockout for (username, address), the per-address rate
//! limit, the credentials. An unknown user and a wrong password get the same answer after the
//! same Argon2id work.

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

/// Reads and answers the first frame; `Some` only for a successful login.
pub(crate) async fn authenticate(
    frames: &mut Frames,
    writer: &mut crate::connection::ConnectionWriter,
    peer: SocketAddr,
    broker: &Arc<Broker>,
    shared: &ServerShared,
) -> Option<Session> {
    let wait = Duration::from_millis(broker.config().auth_timeout_ms);
    let body = match tokio::time::timeout(wait, frames.next()).await {
        Ok(Some(Ok(body))) => body,
        Ok(Some(Err(malachi_wire::FrameError::TooLarge(_)))) => {
            let _ =
                write_frame(writer, &ResponseFrame::error(0, Reason::FrameTooLarge), shared).await;
            return None;
        }
        _ => return None,
    };
    let (corr, outcome) = first_frame(body, peer, broker, shared).await;
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

/// Decodes the first frame and tries it: the corr to answer on, and a session or a reason.
async fn first_frame(
    body: bytes::Bytes,
    peer: SocketAddr,
    broker: &Arc<Broker>,
    shared: &ServerShared,
) -> (u32, Result<(Session, String), Reason>) {
    let Ok(envelope) = RequestEnvelope::parse(body) else {
        return (0, Err(Reason::AuthRequired));
    };
    let corr = envelope.corr;
    match envelope.key() {
        Ok(ApiKey::Auth) => {}
        Ok(ApiKey::MtlsAuth) => return (corr, Err(Reason::MtlsAuthDisabled)),
        Ok(ApiKey::TokenAuth) => return (corr, Err(Reason::OidcAuthDisabled)),
        _ => return (corr, Err(Reason::AuthRequired)),
    }
    match envelope.decode() {
        Ok(frame) => match frame.request {
            Request::Auth(request) => (corr, login(&request, peer, broker, shared).await),
            _ => (0, Err(Reason::AuthRequired)),
        },
        Err(_) => (0, Err(Reason::AuthRequired)),
    }
}

async fn login(
    request: &AuthRequest,
    peer: SocketAddr,
    broker: &Arc<Broker>,
    shared: &ServerShared,
) -> Result<(Session, String), Reason> {
    let username = text(&request.username).unwrap_or_default();
    let password = text(&request.password).unwrap_or_default();
    let address = peer.ip().to_string();
    let now_ms = broker.clock().now_ms();
    let locked =
        broker.admin_group().read(|admin| admin.0.locked_until(&username, &address, now_ms));
    if locked.is_some() {
        return Err(Reason::AccountLocked);
    }
    // Counted as a failure now, in the same step as the check, and refunded below if it
    // succeeds or is never judged: concurrent guesses cannot all pass before one is counted.
    let attempt = if broker.config().rate_limit_enabled {
        let mut limiter = shared.auth_rate.lock().expect("rate limiter lock poisoned");
        Some(limiter.begin(peer.ip(), now_ms).map_err(|_| Reason::RateLimitExceeded)?)
    } else {
        None
    };
    let refund = || {
        if let Some(attempt) = attempt {
            shared.auth_rate.lock().expect("rate limiter lock poisoned").refund(attempt);
        }
    };
    let stored = broker.admin_group().read(|admin| {
        admin.0.user(&username).map(|user| (user.password_hash.clone(), user.permissions.clone()))
    });
    let hash = stored.as_ref().map(|(hash, _)| hash.clone());
    // On the server's own Argon2 threads; a full queue is `overloaded`, judged nothing.
    let matches = match shared.passwords.verify(hash, password).await {
        Ok(matches) => matches,
        Err(reason) => {
            refund();
            return Err(reason);
        }
    };
    let Some((_, permissions)) = stored.filter(|_| matches) else {
        let failure = AdminCommand::RecordLoginFailure { username, address, now_ms };
        let _ = broker.admin_group().propose(failure).await;
        return Err(Reason::InvalidCredentials);
    };
    refund();
    let had_failures =
        broker.admin_group().read(|admin| admin.0.lockout_entry(&username, &address).is_some());
    if had_failures {
        let success = AdminCommand::RecordLoginSuccess { username: username.clone(), address };
        let _ = broker.admin_group().propose(success).await;
    }
    Ok((Session { username, permissions }, new_token(&**broker.entropy())))
}
