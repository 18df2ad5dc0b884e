//! TLS on the client port (`MALACHI_ENABLE_TLS`), with rustls.
//!
//! One port serves TLS and, unless `MALACHI_REQUIRE_TLS`, plain TCP: the first byte tells them
//! apart. A TLS client starts with a handshake record (type 0x16); a plain client starts with a
//! frame length, whose first byte 0x16 would announce a frame of at least 369 MB, far over any
//! frame limit. A plain client on a TLS-only broker is answered `tls_required` and closed.
//!
//! Certificates rotate without a restart: before each handshake the certificate, key and CA
//! files are compared (device, inode, size, change times) with the ones last loaded, and a
//! change builds a new rustls configuration for the connections that follow. A change that does
//! not load (a certificate written before its key, say) keeps the old configuration, logs why,
//! and is tried again when the files change again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_broker::config::{TlsConfig, TlsVerify};
use malachi_transport::tls::FileStamps;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("{path}: no certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {source}")]
    Rejected { path: PathBuf, source: rustls::Error },
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// How a connection reached the server.
#[derive(Clone, Debug)]
pub enum Transport {
    Plain,
    Tls {
        /// The client's end-entity certificate, present only when the listener asked for one
        /// and it verified against the CA bundle.
        client_certificate: Option<CertificateDer<'static>>,
    },
}

/// The TLS side of the client port: the current rustls configuration and what it was built
/// from.
pub struct TlsListener {
    config: TlsConfig,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    /// The files' stamps when last tried, successfully or not.
    stamps: FileStamps,
    acceptor: TlsAcceptor,
}

/// What the first byte of a new connection said.
pub enum Accepted {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>, Transport),
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TlsListener").field("config", &self.config).finish()
    }
}

impl TlsListener {
    /// Loads the configured files; a broker whose TLS files do not load does not start.
    pub fn load(config: TlsConfig) -> Result<TlsListener, TlsError> {
        let stamps = stamps(&config);
        let acceptor = TlsAcceptor::from(build(&config)?);
        Ok(TlsListener { config, loaded: Mutex::new(Loaded { stamps, acceptor }) })
    }

    /// Plain TCP is refused.
    pub fn required(&self) -> bool {
        self.config.require
    }

    /// Client certificates are asked for and verified, so mTLS login is possible.
    pub fn verifies_peers(&self) -> bool {
        self.config.verify == TlsVerify::Peer
    }

    /// The acceptor for the next handshake, rebuilt first if a file changed.
    pub fn acceptor(&self) -> TlsAcceptor {
        let now = stamps(&self.config);
        let mut loaded = self.loaded.lock().expect("tls lock poisoned");
        if now != loaded.stamps {
            loaded.stamps = now;
            match build(&self.config) {
                Ok(server) => {
                    loaded.acceptor = TlsAcceptor::from(server);
                    tracing::info!(certificate = %self.config.cert_file.display(), "TLS files reloaded");
                }
                Err(error) => {
                    tracing::warn!(%error, "TLS files changed but do not load; keeping the previous ones");
                }
            }
        }
        loaded.acceptor.clone()
    }

    /// Reads the first byte and, for TLS, completes the handshake, all within `wait`.
    pub async fn accept(&self, stream: TcpStream, wait: Duration) -> io::Result<Accepted> {
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake in time");
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout(wait, stream.peek(&mut first)).await;
        match peeked.map_err(|_| timed_out())?? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ if first[0] != TLS_HANDSHAKE_RECORD => return Ok(Accepted::Plain(stream)),
            _ => {}
        }
        let handshake = self.acceptor().accept(stream);
        let tls = tokio::time::timeout(wait, handshake).await.map_err(|_| timed_out())??;
        let client_certificate =
            tls.get_ref().1.peer_certificates().and_then(|chain| chain.first()).cloned();
        Ok(Accepted::Tls(Box::new(tls), Transport::Tls { client_certificate }))
    }
}

fn stamps(config: &TlsConfig) -> FileStamps {
    FileStamps::of(files(config))
}

fn files(config: &TlsConfig) -> impl Iterator<Item = &Path> {
    [Some(&config.cert_file), Some(&config.key_file), config.ca_cert_file.as_ref()]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
}

fn build(config: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&config.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&config.key_file)
        .map_err(|source| TlsError::Read { path: config.key_file.clone(), source })?;
    let builder = rustls::ServerConfig::builder();
    let builder = match (&config.verify, &config.ca_cert_file) {
        (TlsVerify::Peer, Some(ca_file)) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca_file)? {
                roots
                    .add(certificate)
                    .map_err(|source| TlsError::Rejected { path: ca_file.clone(), source })?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            // Without FAIL_IF_NO_PEER_CERT a client without a certificate may still log in
            // by password or token; one that offers a certificate must offer a valid one.
            let verifier = if config.fail_if_no_peer_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
        _ => builder.with_no_client_auth(),
    };
    let server = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Rejected { path: config.key_file.clone(), source })?;
    Ok(Arc::new(server))
}

/// Every certificate of a PEM file, in order; an empty file is an error.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read { path: path.to_path_buf(), source };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_path_buf() });
    }
    Ok(chain)
}

/// The user a verified client certificate names under `policy`: its subject's common name, or
/// its first subject alternative name of the chosen kind. `None` if it has none (or does not
/// parse, which a certificate rustls verified always does).
pub fn certificate_identity(
    certificate: &CertificateDer<'_>,
    policy: malachi_broker::config::MtlsPolicy,
) -> Option<String> {
    use malachi_broker::config::MtlsPolicy;
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    if policy == MtlsPolicy::CommonName {
        let name = parsed.subject().iter_common_name().next()?;
        return name.as_str().ok().map(str::to_string);
    }
    let names = parsed.subject_alternative_name().ok()??;
    names.value.general_names.iter().find_map(|name| match (policy, name) {
        (MtlsPolicy::SanUri, GeneralName::URI(uri)) => Some(uri.to_string()),
        (MtlsPolicy::SanDns, GeneralName::DNSName(dns)) => Some(dns.to_string()),
        (MtlsPolicy::SanEmail, GeneralName::RFC822Name(email)) => Some(email.to_string()),
        _ => None,
    })
}
