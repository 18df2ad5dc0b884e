//! The HTTP port of a real `malachi serve`: `/health`, `/ready`, `/metrics` scraped and parsed
//! (every line well-formed, the figures agreeing with what was produced, fetched and
//! committed), and the console's login, sessions and the guards on its admin actions.

mod common;

use std::time::{Duration, Instant};

use common::BrokerProcess;
use common::http::{self, Answer};
use common::webdriver::Browser;
use malachi_client::{FetchOptions, RecordBuilder};

struct Broker {
    process: BrokerProcess,
    _child: ChildGuard,
}

struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Broker {
    fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> Broker {
        let mut process = BrokerProcess::new(dir);
        for (name, value) in env {
            process = process.env(name, *value);
        }
        let child = ChildGuard(process.spawn());
        Broker { process, _child: child }
    }

    fn http(&self) -> String {
        format!("127.0.0.1:{}", self.process.dashboard_port)
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        http::get(&self.http(), path, headers).await
    }

    /// Waits until the HTTP port answers `/ready` with 200.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answered = tokio::net::TcpStream::connect(self.http()).await.is_ok();
            if answered && self.get("/ready", &[]).await.status == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "never ready: {}", self.process.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Logs in to the console; the session cookie (`name=value`).
    async fn login(&self, user: &str, password: &str) -> Result<String, String> {
        let form = format!("username={user}&password={password}");
        let headers = [("content-type", "application/x-www-form-urlencoded")];
        let answer = http::call(&self.http(), "POST", "/login", &headers, Some(&form)).await;
        assert_eq!(answer.status, 303, "{answer:?}");
        match answer.header("set-cookie") {
            Some(cookie) => Ok(cookie.to_string()),
            None => Err(answer.header("location").unwrap_or_default().to_string()),
        }
    }
}

fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// The value of the sample `series` (`name{labels}` exactly as the text writes it).
fn sample(samples: &std::collections::BTreeMap<String, f64>, series: &str) -> f64 {
    *samples.get(series).unwrap_or_else(|| panic!("no {series} in {samples:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_and_metrics_tell_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &[]);
    broker.wait_ready().await;
    let health = broker.get("/health", &[]).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let ready = broker.get("/ready", &[]).await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));

    let client = broker.process.connect().await;
    client.create_topic("orders").await.unwrap();
    for batch in 0..4 {
        let records: Vec<_> = (0..25)
            .map(|n| RecordBuilder::new(format!("b{batch}-{n}")).key(format!("k{n}")).build())
            .collect();
        client.produce("orders", records).await.unwrap();
    }
    let options =
        FetchOptions { max: 30, group: Some("billing".into()), ..FetchOptions::default() };
    let (page, cursor) = client.fetch("orders", &options).await.unwrap();
    client.commit("orders", "billing", &cursor).await.unwrap();
    let read = page.len() as f64;

    let metrics = broker.get("/metrics", &[]).await;
    assert_eq!(metrics.status, 200);
    let content_type = metrics.header("content-type").unwrap();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let samples = http::parse_prometheus(&metrics.body);
    let cases: &[(&str, f64)] = &[
        ("malachi_produced_records_total{topic=\"orders\"}", 100.0),
        ("malachi_fetched_records_total{topic=\"orders\"}", read),
        ("malachi_consumer_lag_records{topic=\"orders\",group=\"billing\"}", 100.0 - read),
        ("malachi_produce_ack_seconds_count", 4.0),
        ("malachi_topic_ranges{topic=\"orders\"}", 1.0),
        ("malachi_segments{state=\"active\"}", 1.0),
        ("malachi_logins_total{method=\"password\",outcome=\"ok\"}", 1.0),
        ("malachi_connections", 1.0),
        ("malachi_raft_is_leader{group=\"vnode-1\"}", 1.0),
        ("malachi_raft_leader{group=\"admin\"}", 1.0),
        ("malachi_broker_status{node_id=\"1\"}", 0.0),
        ("malachi_under_replicated_segments", 0.0),
    ];
    for (series, expected) in cases {
        assert_eq!(sample(&samples, series), *expected, "{series}");
    }
    assert!(sample(&samples, "malachi_commit_sync_seconds_count") >= 1.0);
    assert!(sample(&samples, "malachi_produced_bytes_total{topic=\"orders\"}") > 0.0);
    let ack_sum = sample(&samples, "malachi_produce_ack_seconds_sum");
    assert!(ack_sum > 0.0 && ack_sum < 60.0, "ack seconds {ack_sum}");

    // A wrong password shows in the login outcomes.
    let wrong = broker.process.try_connect_as("app", "not-the-password").await;
    assert!(wrong.is_err());
    let samples = http::parse_prometheus(&broker.get("/metrics", &[]).await.body);
    let refused = "malachi_logins_total{method=\"password\",outcome=\"invalid_credentials\"}";
    assert_eq!(sample(&samples, refused), 1.0);
}

/// `malachi health` (the image's health check) exits 0 only when `/ready` answers 200, and a
/// client command writing into a closed pipe ends by SIGPIPE, as a Unix filter does, not by a
/// panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malachi_health_asks_ready_and_a_closed_pipe_ends_a_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &[]);
    broker.wait_ready().await;
    let malachi = || std::process::Command::new(env!("CARGO_BIN_EXE_malachi"));
    let ready = malachi().args(["health", "--address", &broker.http()]).output().unwrap();
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    assert_eq!(String::from_utf8_lossy(&ready.stdout), "ready\n");
    let nobody = format!("127.0.0.1:{}", common::free_port());
    let refused = malachi().args(["health", "--address", &nobody]).output().unwrap();
    assert!(!refused.status.success(), "nothing listens on {nobody}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains(&nobody), "the failure names the address: {said}");

    let client = broker.process.connect().await;
    client.create_topic("piped").await.unwrap();
    client.produce("piped", vec![RecordBuilder::new("one").build()]).await.unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let consumed = malachi()
        .args(["consume", "piped", "--server", &broker.process.address()])
        .args(["--user", "app", "--password", common::PASSWORD])
        .stdout(writer)
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    let said = String::from_utf8_lossy(&consumed.stderr);
    assert_eq!(consumed.status.signal(), Some(libc::SIGPIPE), "{said}");
    assert!(!said.contains("panicked"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_needs_an_admin_session_and_guards_its_actions() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &[]);
    broker.wait_ready().await;
    broker
        .process
        .connect_as("admin", "admin-password-long")
        .await
        .create_topic("orders")
        .await
        .unwrap();

    // Without a session: the page sends to the login, the API refuses.
    let page = broker.get("/", &[]).await;
    assert_eq!((page.status, page.header("location")), (303, Some("/login")));
    assert_eq!(broker.get("/api/overview", &[]).await.status, 401);
    let login_page = broker.get("/login", &[]).await;
    assert_eq!(login_page.status, 200);
    let csp = login_page.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");

    // Refused logins: each says why, and starts no session.
    let refusals = [
        ("admin", "wrong-password-x", "/login?error=invalid_credentials"),
        ("app", common::PASSWORD, "/login?error=admin_required"),
    ];
    for (user, password, location) in refusals {
        assert_eq!(broker.login(user, password).await, Err(location.to_string()), "{user}");
    }

    let set_cookie = broker.login("admin", "admin-password-long").await.unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(flag), "{flag} in {set_cookie}");
    }
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");
    let cookie = cookie_pair(&set_cookie);
    let session = [("cookie", cookie.as_str())];
    assert_eq!(broker.get("/", &session).await.status, 200);
    let overview = broker.get("/api/overview", &session).await.json();
    assert_eq!(overview["topics"][0]["name"], "orders");
    assert_eq!(overview["viewer"]["username"], "admin");
    let csrf = overview["viewer"]["csrf"].as_str().unwrap().to_string();

    // An admin action needs the session, the CSRF token, and no other site's origin.
    let split = |headers: Vec<(&'static str, String)>| {
        let address = broker.http();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
            let body = r#"{"range_id":0}"#;
            http::call(&address, "POST", "/api/topics/orders/split", &headers, Some(body)).await
        }
    };
    let json = ("content-type", "application/json".to_string());
    let with_cookie = ("cookie", cookie.clone());
    // (request headers, expected status, expected reason)
    type Case<'a> = (Vec<(&'a str, String)>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (vec![json.clone(), ("x-malachi-csrf", csrf.clone())], 401, "login_required"),
        (vec![json.clone(), with_cookie.clone()], 403, "csrf_token_mismatch"),
        (
            vec![json.clone(), with_cookie.clone(), ("x-malachi-csrf", "forged".into())],
            403,
            "csrf_token_mismatch",
        ),
        (
            vec![
                json.clone(),
                with_cookie.clone(),
                ("x-malachi-csrf", csrf.clone()),
                ("origin", "http://evil.example".into()),
            ],
            403,
            "cross_site_request",
        ),
    ];
    for (headers, status, reason) in cases {
        let answer = split(headers).await;
        assert_eq!((answer.status, answer.json()["error"].as_str()), (status, Some(reason)));
    }
    let topic = broker.get("/api/topics/orders", &session).await.json();
    assert_eq!(topic["ranges"].as_array().unwrap().len(), 1, "nothing split yet");
    let done =
        split(vec![json.clone(), with_cookie.clone(), ("x-malachi-csrf", csrf.clone())]).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.json()["low"], 1);
    let topic = broker.get("/api/topics/orders", &session).await.json();
    let active: Vec<bool> = topic["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["active"].as_bool().unwrap())
        .collect();
    assert_eq!(active, [false, true, true], "range 0 split into 1 and 2");

    // After logout the cookie is worth nothing.
    let logout = http::call(&broker.http(), "POST", "/logout", &session, Some("")).await;
    assert_eq!(logout.status, 303);
    assert_eq!(broker.get("/api/overview", &session).await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire_and_the_console_can_go_without_login_or_entirely() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &[("MALACHI_SESSION_TIMEOUT_SEC", "1")]);
    broker.wait_ready().await;
    let cookie = cookie_pair(&broker.login("admin", "admin-password-long").await.unwrap());
    let session = [("cookie", cookie.as_str())];
    assert_eq!(broker.get("/api/overview", &session).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(broker.get("/api/overview", &session).await.status, 401, "expired");

    let open_dir = tempfile::tempdir().unwrap();
    let open = Broker::start(open_dir.path(), &[("MALACHI_DASHBOARD_AUTH_ENABLED", "false")]);
    open.wait_ready().await;
    assert_eq!(open.get("/", &[]).await.status, 200, "no login asked");
    let overview = open.get("/api/overview", &[]).await.json();
    assert!(overview["viewer"].is_null());
    let split = http::call(
        &open.http(),
        "POST",
        "/api/topics/orders/split",
        &[("content-type", "application/json")],
        Some(r#"{"range_id":0}"#),
    )
    .await;
    assert_eq!(split.status, 401, "actions still need an admin's session");

    let off_dir = tempfile::tempdir().unwrap();
    let off = Broker::start(off_dir.path(), &[("MALACHI_DASHBOARD_ENABLED", "false")]);
    off.process.connect().await;
    assert!(tokio::net::TcpStream::connect(off.http()).await.is_err(), "no HTTP port");
}

/// With TLS on the client port the HTTP port speaks HTTPS with the same certificate: session
/// cookies set over it are `Secure`; plain HTTP keeps answering (scrapers, health checks) until
/// `MALACHI_REQUIRE_TLS`, which closes it without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tls_the_http_port_speaks_https_with_secure_cookies() {
    let keys = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (keys.path().join("broker.crt"), keys.path().join("broker.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let (cert_path, key_path) = (cert.display().to_string(), key.display().to_string());
    let tls = |required: &'static str| {
        [
            ("MALACHI_ENABLE_TLS", "true"),
            ("MALACHI_REQUIRE_TLS", required),
            ("MALACHI_TLS_CERTFILE", cert_path.as_str()),
            ("MALACHI_TLS_KEYFILE", key_path.as_str()),
        ]
    };
    let form = "username=admin&password=admin-password-long";
    let login: http::Request =
        ("POST", "/login", &[("content-type", "application/x-www-form-urlencoded")], Some(form));

    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &tls("false"));
    broker.wait_ready().await;
    let health = http::call_tls(&broker.http(), &cert, ("GET", "/health", &[], None)).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let over_tls = http::call_tls(&broker.http(), &cert, login).await;
    let cookie = over_tls.header("set-cookie").unwrap();
    assert!(cookie.contains("; Secure") && cookie.contains("HttpOnly"), "{cookie}");
    let (method, path, headers, body) = login;
    let plain = http::call(&broker.http(), method, path, headers, body).await;
    let cookie = plain.header("set-cookie").unwrap();
    assert!(!cookie.contains("Secure"), "a Secure cookie would never come back: {cookie}");

    let required_dir = tempfile::tempdir().unwrap();
    let required = Broker::start(required_dir.path(), &tls("true"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(required.http()).await.is_err() {
        assert!(Instant::now() < deadline, "no HTTP port: {}", required.process.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = http::call_tls(&required.http(), &cert, ("GET", "/ready", &[], None)).await;
    assert_eq!(ready.status, 200);
    let stream = tokio::net::TcpStream::connect(required.http()).await.unwrap();
    let answer = http::exchange(stream, &required.http(), ("GET", "/health", &[], None)).await;
    assert!(answer.is_empty(), "plain HTTP answered: {}", String::from_utf8_lossy(&answer));
}

/// The console walked in a real browser (headless Chromium through chromedriver) as a new
/// operator would: log in (a wrong password first), see a topic appear once records are produced,
/// split its range from the range tree and see the tree change, and see a consumer group's lag
/// fall as it commits. Screenshots of each page are left in `target/tmp/console-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_walks_the_console_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), &[]);
    broker.wait_ready().await;
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let browser = Browser::start(&shots).await;
    let base = format!("http://{}", broker.http());

    browser.goto(&format!("{base}/")).await;
    browser.wait_count("#login-form", 1).await;
    assert!(browser.url().await.ends_with("/login"), "sent to the login page");
    browser.screenshot("1-login").await;
    let log_in = async |password: &str| {
        browser.type_into("#username", "admin").await;
        browser.type_into("#password", password).await;
        browser.click("#login-submit").await;
    };
    log_in("not-the-password").await;
    browser.wait_text("#login-error", "a refusal", |t| t.contains("do not match")).await;
    log_in("admin-password-long").await;
    browser.wait_text("#view h1", "the overview", |t| t == "Overview").await;
    assert_eq!(browser.text("#viewer-name").await, "admin");

    // A topic appears with its records once they are produced.
    let client = broker.process.connect().await;
    client.create_topic("orders").await.unwrap();
    let produce = async |count: usize, tag: &str| {
        let records: Vec<_> = (0..count)
            .map(|n| RecordBuilder::new(format!("{tag}-{n}")).key(format!("user-{n}")).build())
            .collect();
        client.produce("orders", records).await.unwrap();
    };
    produce(120, "first").await;
    let records = r#"#topics-table tr[data-topic="orders"] .records"#;
    browser.wait_text(records, "120 records", |t| t == "120").await;
    browser.screenshot("2-overview").await;

    // The range tree: one range, split from the console into two buddy halves.
    browser.click(r#"#topics-table tr[data-topic="orders"] a"#).await;
    browser.wait_count("#range-tree rect", 1).await;
    browser.click(r#"#range-tree rect[data-range-id="0"]"#).await;
    browser.click("#split-range").await;
    let question = browser.accept_dialog().await;
    assert!(question.starts_with("Split range 0 of orders"), "{question}");
    browser.wait_count("#range-tree rect", 3).await;
    browser.wait_count(r#"#range-tree rect[data-active="true"]"#, 2).await;
    let described = client.describe_topic("orders").await.unwrap();
    assert_eq!(described.ranges.len(), 3, "the split reached the broker: {described:?}");
    produce(30, "second").await;
    browser.screenshot("3-topic-after-split").await;

    // Lag: 150 records, the group commits after 50 and then after all of them.
    let options = FetchOptions { max: 50, group: Some("billing".into()), ..Default::default() };
    let (page, cursor) = client.fetch("orders", &options).await.unwrap();
    assert_eq!(page.len(), 50);
    client.commit("orders", "billing", &cursor).await.unwrap();
    browser.click(r#".tabs a[data-tab="groups"]"#).await;
    let lag = r#"#groups-table tr[data-group="billing"] .lag-total"#;
    browser.wait_text(lag, "a lag of 100", |t| t == "100").await;
    browser.screenshot("4-groups-behind").await;
    let (rest, cursor) = common::drain(&client, "orders", Some(cursor)).await;
    assert_eq!(rest.len(), 100);
    client.commit("orders", "billing", &cursor).await.unwrap();
    browser.wait_text(lag, "the lag fall to 0", |t| t == "0").await;
    browser.screenshot("5-groups-caught-up").await;
}
