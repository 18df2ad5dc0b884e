//! Malachi's HTTP port (`MALACHI_DASHBOARD_PORT`, 4041): `/health` (the process is up),
//! `/ready` (this broker can serve, or 503 with the reason), `/metrics` (the broker's registry
//! in the Prometheus text format) and the web console: its pages and assets, embedded in the
//! binary, and the JSON API they poll.
//!
//! It reads and changes the log only through `malachi-broker`'s API, and logs users in only
//! through `malachi-server`'s password login (the same lockouts, rate limits and Argon2id as
//! the client port). It keeps nothing but console sessions, in memory.

mod api;
mod listener;
mod sessions;

use malachi_reason::Reason;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{ConnectInfo, Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use listener::HttpListener;
use malachi_broker::node::Broker;
use malachi_server::ServerShared;
use tokio::net::TcpListener;

pub use listener::Peer;
pub use sessions::{ConsoleSession, Refused, SESSIONS_MAX, Sessions};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "malachi_session";
/// The header that carries a session's CSRF token on every state-changing request.
pub const CSRF_HEADER: &str = "x-malachi-csrf";

const INDEX_HTML: &str = include_str!("assets/index.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Served with every answer: the console loads nothing from elsewhere, runs no inline script,
/// and is never framed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'";

/// The HTTP port, bound.
pub struct Console {
    listener: TcpListener,
    state: Arc<AppState>,
}

pub(crate) struct AppState {
    pub(crate) broker: Arc<Broker>,
    shared: Arc<ServerShared>,
    sessions: Mutex<Sessions>,
    auth_enabled: bool,
    require_admin: bool,
}

/// Who is asking: a logged-in user, or anyone when the console asks for no login.
#[derive(Clone, Debug)]
pub(crate) struct Viewer {
    pub(crate) session: Option<ConsoleSession>,
}

impl Console {
    /// Binds `MALACHI_DASHBOARD_PORT` on the client port's address.
    pub async fn bind(broker: Arc<Broker>, shared: Arc<ServerShared>) -> std::io::Result<Console> {
        let config = broker.config();
        let dashboard = &config.dashboard;
        let listener = TcpListener::bind((config.bind_address.as_str(), dashboard.port)).await?;
        let state = Arc::new(AppState {
            sessions: Mutex::new(Sessions::new(
                dashboard.session_timeout_sec.saturating_mul(1000),
                dashboard.session_ip_binding,
            )),
            auth_enabled: dashboard.auth_enabled,
            require_admin: dashboard.require_admin,
            broker,
            shared,
        });
        Ok(Console { listener, state })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) {
        let listener = match HttpListener::start(self.listener, self.state.shared.clone()) {
            Ok(listener) => listener,
            Err(error) => return tracing::warn!(%error, "the HTTP port stopped"),
        };
        let app = router(self.state).into_make_service_with_connect_info::<Peer>();
        if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(%error, "the HTTP port stopped");
        }
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/", get(index))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/assets/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/api/overview", get(api::overview))
        .route("/api/groups", get(api::groups))
        .route("/api/topics/{name}", get(api::topic))
        .route("/api/topics/{name}/split", post(api::split))
        .route("/api/topics/{name}/merge", post(api::merge))
        .route("/api/topics/{name}/delete", post(api::delete))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Not `no-referrer`: under it a browser sends `Origin: null` with the console's own form
    // posts, which the same-origin check must then refuse.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

fn html(body: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        body,
    )
        .into_response()
}

async fn health() -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "ok\n").into_response()
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match state.broker.observer().readiness() {
        Ok(()) => (plain, "ready\n".to_string()).into_response(),
        Err(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, plain, format!("{reason}\n")).into_response()
        }
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.broker.observer().render_metrics().await;
    ([(header::CONTENT_TYPE, malachi_broker::metrics::CONTENT_TYPE)], text).into_response()
}

async fn index(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, .. }): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    match state.viewer(&headers, peer.ip()) {
        Ok(_) => html(INDEX_HTML),
        Err(_) => Redirect::to("/login").into_response(),
    }
}

async fn login_page(State(state): State<Arc<AppState>>) -> Response {
    if !state.auth_enabled {
        return Redirect::to("/").into_response();
    }
    html(LOGIN_HTML)
}

#[derive(serde::Deserialize)]
struct LoginForm {
    username: String,
    password: String,
}

async fn login(
    State(state): State<Arc<AppState>>,
    ConnectInfo(Peer { address: peer, tls }): ConnectInfo<Peer>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response();
    }
    if !state.auth_enabled {
        return Redirect::to("/").into_response();
    }
    let broker = &state.broker;
    let logged_in =
        malachi_server::password_login(broker, &state.shared, peer, &form.username, &form.password)
            .await;
    let session = match logged_in {
        Ok(session) => session,
        Err(reason) => {
            return Redirect::to(&format!("/login?error={}", reason.as_str())).into_response();
        }
    };
    if state.require_admin && !session.is_admin() {
        return Redirect::to("/login?error=admin_required").into_response();
    }
    let entropy = broker.entropy();
    let token = malachi_broker::auth::new_token(&**entropy);
    let console_session = ConsoleSession {
        admin: session.is_admin(),
        username: session.username,
        csrf: malachi_broker::auth::new_token(&**entropy),
        address: peer.ip(),
        last_used_ms: broker.clock().now_ms(),
    };
    state.lock_sessions().open(token.clone(), console_session);
    // Over TLS the cookie never travels in the clear afterwards.
    let secure = if tls { "; Secure" } else { "" };
    let cookie = format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

async fn logout(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response();
    }
    if let Some(token) = session_token(&headers) {
        state.lock_sessions().close(&token);
    }
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response()
}

impl AppState {
    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().expect("sessions lock poisoned")
    }

    /// The viewer of a request: its session, or anyone when the console asks for no login.
    pub(crate) fn viewer(&self, headers: &HeaderMap, address: IpAddr) -> Result<Viewer, Refused> {
        let token = session_token(headers);
        let now_ms = self.broker.clock().now_ms();
        let session = token.map(|token| self.lock_sessions().touch(&token, address, now_ms));
        match session {
            Some(Ok(session)) => Ok(Viewer { session: Some(session) }),
            _ if !self.auth_enabled => Ok(Viewer { session: None }),
            Some(Err(refused)) => Err(refused),
            None => Err(Refused::Unknown),
        }
    }

    /// The viewer of a request that changes something: an admin's session, the request from
    /// the console's own pages (same origin), carrying the session's CSRF token.
    pub(crate) fn actor(
        &self,
        headers: &HeaderMap,
        address: IpAddr,
    ) -> Result<ConsoleSession, (StatusCode, &'static str)> {
        if !same_origin(headers) {
            return Err((StatusCode::FORBIDDEN, Reason::CrossSiteRequest.as_str()));
        }
        let viewer = self
            .viewer(headers, address)
            .map_err(|_| (StatusCode::UNAUTHORIZED, Reason::LoginRequired.as_str()))?;
        let session =
            viewer.session.ok_or((StatusCode::UNAUTHORIZED, Reason::LoginRequired.as_str()))?;
        if !session.admin {
            return Err((StatusCode::FORBIDDEN, Reason::PermissionDenied.as_str()));
        }
        let csrf = headers.get(CSRF_HEADER).and_then(|value| value.to_str().ok());
        if csrf != Some(session.csrf.as_str()) {
            return Err((StatusCode::FORBIDDEN, Reason::CsrfTokenMismatch.as_str()));
        }
        Ok(session)
    }
}

/// The session token from the request's cookie, if any.
fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|value| !value.is_empty())
}

/// Whether a state-changing request comes from the console's own pages: a browser says so in
/// `Sec-Fetch-Site` (current browsers) or names the page's origin in `Origin`; a request from
/// another origin is another site's page. A request naming neither (a script, curl) has no ambient
/// cookie to abuse, and still needs the session and CSRF token.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    // The browser sets `Sec-Fetch-Site` and no page can forge it: when present it decides.
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some("same-origin" | "none") => return true,
        Some(_) => return false,
        None => {}
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host)
        }
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn same_origin_table() {
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[], true),
            (&[("host", "h:4041"), ("origin", "http://h:4041")], true),
            (&[("host", "h:4041"), ("origin", "https://h:4041")], true),
            (&[("host", "h:4041"), ("origin", "http://evil:80")], false),
            (&[("host", "h:4041"), ("origin", "null")], false),
            (&[("origin", "http://h:4041")], false),
            (&[("sec-fetch-site", "cross-site")], false),
            (&[("sec-fetch-site", "same-site")], false),
            (&[("sec-fetch-site", "same-origin"), ("host", "h"), ("origin", "http://h")], true),
            (&[("sec-fetch-site", "same-origin"), ("host", "h"), ("origin", "null")], true),
            (&[("sec-fetch-site", "cross-site"), ("host", "h"), ("origin", "http://h")], false),
        ];
        for (pairs, expected) in cases {
            assert_eq!(same_origin(&headers(pairs)), *expected, "{pairs:?}");
        }
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (&[("cookie", "malachi_session=abc")], Some("abc")),
            (&[("cookie", "a=1; malachi_session=abc; b=2")], Some("abc")),
            (&[("cookie", "a=1"), ("cookie", "malachi_session=xyz")], Some("xyz")),
            (&[("cookie", "malachi_session=")], None),
            (&[("cookie", "other_session=abc")], None),
            (&[], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(session_token(&headers(pairs)).as_deref(), *expected, "{pairs:?}");
        }
    }
}
