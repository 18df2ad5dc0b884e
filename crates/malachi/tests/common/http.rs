//! Just enough HTTP/1.1 for the tests of the HTTP port: one request per connection
//! (`Connection: close`), plain or TLS, the whole answer read, chunked bodies decoded; and a
//! strict reader of the Prometheus text format.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, value)| value.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One request: method, path, headers and body.
pub type Request<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], Option<&'a str>);

/// Sends one request to `address` (`host:port`) and reads the whole answer.
pub async fn call(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let stream = TcpStream::connect(address).await.expect("the HTTP port accepts");
    parse(&exchange(stream, address, (method, path, headers, body)).await)
}

/// The same over TLS, trusting the certificates in the PEM file `ca` for the name `localhost`.
pub async fn call_tls(address: &str, ca: &Path, request: Request<'_>) -> Answer {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = TcpStream::connect(address).await.expect("the HTTP port accepts");
    let name = ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, stream).await.expect("a TLS handshake");
    parse(&exchange(stream, address, request).await)
}

/// Writes one request and reads the answer's bytes: empty when the server closed without one.
pub async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    address: &str,
    (method, path, headers, body): Request<'_>,
) -> Vec<u8> {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body.unwrap_or_default());
    if stream.write_all(request.as_bytes()).await.is_err() {
        return Vec::new();
    }
    // Read to the end of the answer: its Content-Length when it gives one (chromedriver keeps
    // the connection open despite `Connection: close`), else to the end of the stream.
    let mut raw = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    while !complete(&raw) {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => raw.extend_from_slice(&buffer[..read]),
        }
    }
    raw
}

/// Whether `raw` holds a whole answer that says its length.
fn complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == "content-length").then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|length| raw.len() >= end + 4 + length)
}

pub async fn get(address: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    call(address, "GET", path, headers, None).await
}

/// A GET of `path` from a server that may not listen yet or may close without answering: the
/// answer, or `None`.
pub async fn try_get(address: &str, path: &str) -> Option<Answer> {
    let stream = TcpStream::connect(address).await.ok()?;
    let raw = exchange(stream, address, ("GET", path, &[], None)).await;
    (!raw.is_empty()).then(|| parse(&raw))
}

fn parse(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Answer { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return body;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// Every sample of a Prometheus text exposition, keyed `name{labels}` as written; panics on
/// any line that is not a comment, a `# HELP`/`# TYPE` line or a well-formed sample, and on a
/// sample of a family with no `# TYPE`.
pub fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut typed = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(valid_name(name), "metric name {name:?}");
            let kinds = ["counter", "gauge", "histogram", "summary", "untyped"];
            assert!(kinds.contains(&kind), "type {kind:?} of {name}");
            typed.insert(name.to_string(), kind.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').expect("# HELP name text");
            assert!(valid_name(name), "metric name {name:?}");
            continue;
        }
        assert!(!line.starts_with('#') || line.starts_with("# "), "comment {line:?}");
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = split_sample(line);
        let name = series.split('{').next().unwrap();
        assert!(valid_name(name), "metric name in {line:?}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|base| typed.contains_key(*base)))
            .unwrap_or(name);
        assert!(typed.contains_key(family), "{name} has no # TYPE line");
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            number => number.parse().unwrap_or_else(|_| panic!("value of {line:?}")),
        };
        assert!(samples.insert(series.to_string(), value).is_none(), "{series} twice");
    }
    samples
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// (`name{labels}`, value) of a sample line, its label values checked for their quoting.
fn split_sample(line: &str) -> (&str, &str) {
    let Some(open) = line.find('{') else {
        let (series, value) = line.split_once(' ').expect("name value");
        return (series, value.split(' ').next().unwrap());
    };
    let bytes = line.as_bytes();
    let mut at = open + 1;
    loop {
        let eq = line[at..].find('=').map(|i| at + i).expect("label=value");
        assert!(valid_name(&line[at..eq]), "label name in {line:?}");
        assert_eq!(bytes[eq + 1], b'"', "quoted label value in {line:?}");
        let mut end = eq + 2;
        while bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        at = end + 1;
        match bytes[at] {
            b',' => at += 1,
            b'}' => break,
            other => panic!("{:?} after a label in {line:?}", other as char),
        }
    }
    let series = &line[..=at];
    let value = line[at + 1..].trim_start().split(' ').next().unwrap();
    (series, value)
}
