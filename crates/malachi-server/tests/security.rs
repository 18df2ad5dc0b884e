//! TLS on the client port, certificate rotation, and certificate and token logins, over real
//! sockets with certificates and keys made in the test.

mod harness;
mod pki;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use harness::{TestServer, start};
use malachi_client::{Client, ClientConfig, ClientError, RecordBuilder, TlsOptions};
use pki::{Authority, Pair};
use rcgen::SanType;

/// A CA, a broker certificate it signed, and the files in a directory kept for the test.
struct Setup {
    dir: tempfile::TempDir,
    authority: Authority,
    ca: PathBuf,
    broker: Pair,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let authority = Authority::new("test ca");
        let ca = authority.write_ca(&dir.path().join("ca.crt"));
        let broker = authority.broker(dir.path(), "broker");
        Setup { dir, authority, ca, broker }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Broker settings for TLS with these files, plus `extra`.
    fn settings(&self, extra: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
        let mut all = vec![
            ("ENABLE_TLS".to_string(), "true".to_string()),
            ("TLS_CERTFILE".into(), self.broker.cert.display().to_string()),
            ("TLS_KEYFILE".into(), self.broker.key.display().to_string()),
            ("TLS_CACERTFILE".into(), self.ca.display().to_string()),
        ];
        all.extend(extra.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        all
    }

    fn tls(&self, client_certificate: Option<&Pair>) -> TlsOptions {
        TlsOptions {
            ca_file: Some(self.ca.clone()),
            client_certificate: client_certificate
                .map(|pair| (pair.cert.clone(), pair.key.clone())),
            server_name: None,
        }
    }
}

async fn start_with(settings: &[(String, String)]) -> TestServer {
    let borrowed: Vec<(&str, &str)> =
        settings.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    start(&borrowed).await
}

fn app(server: &TestServer) -> ClientConfig {
    ClientConfig::new(server.address.to_string()).credentials("app", "app123")
}

/// The reason a refused connect or call carries.
fn reason(result: Result<Client, ClientError>) -> String {
    match result {
        Ok(_) => "logged in".into(),
        Err(error) => error.reason_text().map_or_else(|| error.to_string(), str::to_string),
    }
}

async fn produce_and_fetch(client: &Client, topic: &str) {
    client.create_topic(topic).await.unwrap();
    client.produce(topic, vec![RecordBuilder::new("over tls").key("k").build()]).await.unwrap();
    let (records, _) = client.fetch(topic, &Default::default()).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_broker_refuses_plain_tcp_and_serves_tls() {
    let setup = Setup::new();
    let server = start_with(&setup.settings(&[("REQUIRE_TLS", "true")])).await;
    assert_eq!(reason(Client::connect(app(&server)).await), "tls_required");
    let client = Client::connect(app(&server).tls(setup.tls(None))).await.expect("TLS login");
    produce_and_fetch(&client, "secure").await;
    // A client that does not trust the broker's CA does not get as far as sending a password.
    let stranger = Authority::new("another ca").write_ca(&setup.path().join("other-ca.crt"));
    let untrusting = TlsOptions { ca_file: Some(stranger), ..setup.tls(None) };
    let refused = Client::connect(app(&server).tls(untrusting)).await.unwrap_err();
    assert!(refused.to_string().contains("certificate"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_require_tls_one_port_serves_both() {
    let setup = Setup::new();
    let server = start_with(&setup.settings(&[])).await;
    let plain = Client::connect(app(&server)).await.expect("plain login");
    let tls = Client::connect(app(&server).tls(setup.tls(None))).await.expect("TLS login");
    produce_and_fetch(&plain, "plain").await;
    produce_and_fetch(&tls, "tls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let setup = Setup::new();
    let server = start_with(&setup.settings(&[])).await;
    let before = Client::connect(app(&server).tls(setup.tls(None))).await.expect("first cert");
    // The operator replaces the broker's certificate with one from a new CA.
    let next = Authority::new("next ca");
    let next_ca = next.write_ca(&setup.path().join("next-ca.crt"));
    let renewed = next.broker(setup.path(), "renewed");
    pki::rotate(&renewed, &setup.broker);
    let trusting_next = TlsOptions { ca_file: Some(next_ca), ..setup.tls(None) };
    let after = Client::connect(app(&server).tls(trusting_next)).await.expect("renewed cert");
    produce_and_fetch(&after, "rotated").await;
    let old_trust = Client::connect(app(&server).tls(setup.tls(None))).await;
    assert!(old_trust.is_err(), "the old certificate is no longer served");
    // A connection made before the rotation keeps working.
    before.describe_topic("rotated").await.expect("the earlier connection still serves");
    // A half-written rotation (a key that does not match) keeps the certificate that works.
    std::fs::copy(&setup.broker.key, setup.path().join("renewed-key.bak")).unwrap();
    let mismatched = next.broker(setup.path(), "mismatch");
    std::fs::copy(&mismatched.key, &setup.broker.key).unwrap();
    let trusting_next =
        TlsOptions { ca_file: Some(next.write_ca(&setup.path().join("n.crt"))), ..setup.tls(None) };
    Client::connect(app(&server).tls(trusting_next)).await.expect("the last good certificate");
}

/// A user named by the certificate must exist: `app` does (harness accounts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_logins() {
    let setup = Setup::new();
    let dir = setup.path();
    let email = |address: &str| SanType::Rfc822Name(address.try_into().unwrap());
    let app_cn = setup.authority.client(dir, "app", "app", vec![email("consumer@example.org")]);
    let nobody = setup.authority.client(dir, "nobody", "nobody", vec![]);
    let rogue = Authority::new("rogue").client(dir, "rogue", "app", vec![]);
    let verifying = [("TLS_VERIFY", "verify_peer"), ("MTLS_AUTH", "true")];
    let by_email = [verifying[0], verifying[1], ("MTLS_POLICY", "san:email")];
    let no_mtls = [("TLS_VERIFY", "verify_peer")];
    let not_verifying = [("MTLS_AUTH", "true")];
    // (broker settings, client certificate, over TLS, expected outcome)
    type Case<'a> = (&'a [(&'static str, &'static str)], Option<&'a Pair>, bool, &'a str);
    let cases: [Case; 8] = [
        (&verifying, Some(&app_cn), true, "logged in"),
        (&verifying, Some(&nobody), true, "invalid_credentials"),
        (&verifying, None, true, "no_peer_certificate"),
        (&verifying, None, false, "mtls_auth_unavailable"),
        (&by_email, Some(&app_cn), true, "invalid_credentials"),
        (&no_mtls, Some(&app_cn), true, "mtls_auth_disabled"),
        (&not_verifying, Some(&app_cn), true, "mtls_auth_unavailable"),
        (&verifying, Some(&rogue), true, "handshake"),
    ];
    for (index, (settings, certificate, over_tls, expected)) in cases.into_iter().enumerate() {
        let server = start_with(&setup.settings(settings)).await;
        let mut config = ClientConfig::new(server.address.to_string()).certificate_login();
        if over_tls {
            config = config.tls(setup.tls(certificate));
        }
        let outcome = reason(Client::connect(config).await);
        let matches = match expected {
            "handshake" => outcome != "logged in" && !outcome.contains('_'),
            _ => outcome == expected,
        };
        assert!(matches, "case {index} {settings:?}: {outcome}");
    }
    // Under `san:email` the address names the user: the consumer account.
    let server = start_with(&setup.settings(&by_email)).await;
    let config = ClientConfig::new(server.address.to_string()).certificate_login();
    let admin = ClientConfig::new(server.address.to_string())
        .credentials("admin", malachi_broker::testing::ADMIN_PASSWORD);
    let admin = Client::connect(admin).await.expect("admin login");
    admin
        .create_user("consumer@example.org", "a-long-enough-password", &["consume"])
        .await
        .unwrap();
    let client = Client::connect(config.tls(setup.tls(Some(&app_cn)))).await.expect("email login");
    let refused = client.produce("t", vec![RecordBuilder::new("x").build()]).await.unwrap_err();
    assert_eq!(refused.reason_text(), Some("permission_denied"), "the stored permissions apply");
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_logins() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let setup = Setup::new();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let public = setup.path().join("issuer.pem");
    std::fs::write(&public, key.public_key_pem()).unwrap();
    let signing = EncodingKey::from_rsa_pem(key.serialize_pem().as_bytes()).unwrap();
    let token = |subject: &str, expires_in_s: i64| {
        let claims = serde_json::json!({
            "sub": subject, "iss": "https://idp.example", "aud": "malachi",
            "exp": now_s().saturating_add_signed(expires_in_s),
        });
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &signing).unwrap()
    };
    let oidc = |key_file: &Path| {
        vec![
            ("OIDC_AUTH".to_string(), "true".to_string()),
            ("OIDC_ISSUER".into(), "https://idp.example".into()),
            ("OIDC_AUDIENCE".into(), "malachi".into()),
            ("OIDC_PUBLIC_KEY_FILE".into(), key_file.display().to_string()),
        ]
    };
    let server = start_with(&oidc(&public)).await;
    let login = |jwt: String| {
        Client::connect(ClientConfig::new(server.address.to_string()).token_login(jwt))
    };
    let client = login(token("app", 600)).await.expect("token login");
    produce_and_fetch(&client, "by-token").await;
    assert_eq!(reason(login(token("app", -3600)).await), "invalid_credentials", "expired");
    assert_eq!(reason(login(token("stranger", 600)).await), "invalid_credentials", "no such user");
    assert_eq!(reason(login("x.y.z".into()).await), "invalid_credentials", "garbage");
    let misconfigured = start_with(&oidc(&setup.path().join("missing.pem"))).await;
    let config =
        ClientConfig::new(misconfigured.address.to_string()).token_login(token("app", 600));
    assert_eq!(reason(Client::connect(config).await), "oidc_misconfigured");
    let off = start(&[]).await;
    let config = ClientConfig::new(off.address.to_string()).token_login(token("app", 600));
    assert_eq!(reason(Client::connect(config).await), "oidc_auth_disabled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_subscribe_quotas_are_per_user() {
    let server = start(&[("PUBLISH_RATE_LIMIT", "10"), ("SUBSCRIBE_RATE_LIMIT", "1")]).await;
    let records = |count: usize| {
        (0..count).map(|index| RecordBuilder::new(format!("r{index}")).build()).collect::<Vec<_>>()
    };
    let client = Client::connect(app(&server)).await.unwrap();
    client.create_topic("metered").await.unwrap();
    let refusal = |result: Result<u32, ClientError>| match result {
        Ok(_) => "accepted".to_string(),
        Err(error) => error.reason_text().unwrap_or("other").to_string(),
    };
    assert_eq!(refusal(client.produce("metered", records(11)).await), "quota_too_small");
    assert_eq!(refusal(client.produce("metered", records(6)).await), "accepted");
    assert_eq!(refusal(client.produce("metered", records(6)).await), "rate_limited");
    // Another user has a bucket of its own.
    let other =
        ClientConfig::new(server.address.to_string()).credentials("producer", "producer123");
    let other = Client::connect(other).await.unwrap();
    assert_eq!(refusal(other.produce("metered", records(6)).await), "accepted");
    let subscribe = || async {
        let client = Client::connect(app(&server)).await.unwrap();
        let reason = |error: ClientError| error.reason_text().unwrap_or("other").to_string();
        // The topic has records, so an accepted subscription pushes at once.
        let mut subscription =
            client.subscribe("metered", &Default::default()).await.map_err(reason)?;
        subscription.next().await.map(|_| ()).map_err(reason)
    };
    assert_eq!(subscribe().await, Ok(()));
    assert_eq!(subscribe().await, Err("rate_limited".to_string()));
}

/// After login, a client that sends requests but never reads the answers cannot make the broker
/// buffer them: requests are answered one at a time, an answer that cannot be written within
/// `MALACHI_TCP_SEND_TIMEOUT` closes the connection, and reading stops meanwhile (TCP pushes
/// back on the sender). Here 2,000 fetches would be answered with 500 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_not_buffered() {
    use malachi_wire::messages::FetchRequest;
    use malachi_wire::{Expect, Request};
    let server = start(&[("TCP_SEND_TIMEOUT", "1000")]).await;
    let client = Client::connect(app(&server)).await.unwrap();
    client.create_topic("large").await.unwrap();
    let value = vec![b'v'; 256 * 1024];
    client.produce("large", vec![RecordBuilder::new(value).build()]).await.unwrap();
    let mut greedy = harness::WireClient::login(server.address, "app", "app123").await;
    let fetch = || {
        Request::Fetch(FetchRequest {
            topic: harness::text("large"),
            max_records: 1,
            ..FetchRequest::default()
        })
    };
    const REQUESTS: usize = 2_000;
    for _ in 0..REQUESTS {
        greedy.send(fetch()).await;
    }
    // The broker gives up on the stuck connection after its send timeout...
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    // ...and serves everyone else meanwhile.
    produce_and_fetch(&client, "others").await;
    let mut answered = 0;
    while let Some(frame) = greedy.recv(Expect::Reply(malachi_wire::ApiKey::Fetch)).await {
        assert!(matches!(frame.body, malachi_wire::ResponseBody::Ok(_)), "{frame:?}");
        answered += 1;
    }
    assert!(answered < REQUESTS / 4, "{answered} of {REQUESTS} answers were buffered");
}
