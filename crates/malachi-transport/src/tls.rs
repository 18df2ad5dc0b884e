//! TLS 1.3 with mutual authentication between brokers (docs/security.md, "Between brokers").
//!
//! Every broker holds a certificate of the cluster CA naming its node (`pki.rs`). A caller
//! checks that the broker it reaches has a certificate of the CA naming the node it dialled
//! (or any node, when it only knows an address); the answering broker takes the caller's node
//! id from the caller's certificate. A caller without a certificate (a broker that has not
//! joined yet) is let in as a stranger, which may only enroll ([`crate::Caller`]).
//!
//! Certificates rotate without a restart, as on the client port: before each handshake the
//! files' stamps are compared with the ones last loaded, and a change builds new
//! configurations; files that do not load keep the previous ones, with a warning.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::pki::{ClusterFiles, node_id_from_name, node_id_of, node_name};

/// The name a caller asks for when it knows only an address: any node of the cluster answers.
pub const ANY_NODE: &str = "any-node.malachi.internal";

/// Why the cluster's TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("{path}: the certificate names no node (node-<id>.malachi.internal)")]
    NoNode { path: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// This broker's inter-node TLS: its certificate, key and the cluster CA, reloaded on change.
pub struct ClusterTls {
    files: ClusterFiles,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    stamps: FileStamps,
    node_id: u64,
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ClusterTls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// Loads the files; a broker whose files do not load does not start.
    pub fn load(files: ClusterFiles) -> Result<ClusterTls, TlsError> {
        let stamps = stamps(&files);
        let loaded = build(&files, stamps)?;
        Ok(ClusterTls { files, loaded: Mutex::new(loaded) })
    }

    /// The node this broker's certificate names.
    pub fn node_id(&self) -> u64 {
        self.loaded.lock().expect("tls lock").node_id
    }

    /// The configurations for the next handshake, rebuilt first if a file changed.
    pub(crate) fn current(&self) -> (TlsConnector, TlsAcceptor) {
        let now = stamps(&self.files);
        let mut loaded = self.loaded.lock().expect("tls lock");
        if now != loaded.stamps {
            let node_id = loaded.node_id;
            match build(&self.files, now.clone()) {
                Ok(fresh) if fresh.node_id == node_id => {
                    *loaded = fresh;
                    tracing::info!(certificate = %self.files.node_cert.display(), "inter-node TLS files reloaded");
                }
                Ok(fresh) => {
                    loaded.stamps = now;
                    tracing::warn!(
                        node_id,
                        named = fresh.node_id,
                        "the new inter-node certificate names another node; keeping the previous one"
                    );
                }
                Err(error) => {
                    loaded.stamps = now;
                    tracing::warn!(%error, "inter-node TLS files changed but do not load; keeping the previous ones");
                }
            }
        }
        (loaded.connector.clone(), loaded.acceptor.clone())
    }
}

/// The connector of a broker that has no certificate yet: it offers none and accepts any
/// server certificate, because what it is about to say (an enrollment) proves the token to the
/// seed and has the seed prove it back, both bound to this very session.
pub fn stranger_connector() -> Result<TlsConnector, TlsError> {
    let provider = provider();
    let verifier = Arc::new(AnyCertificate { provider: Arc::clone(&provider) });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The server name a caller checks: the node it dialled, or any node.
pub fn server_name(expected: Option<u64>) -> ServerName<'static> {
    let name = expected.map_or_else(|| ANY_NODE.to_string(), node_name);
    ServerName::try_from(name).expect("node names are DNS names")
}

/// The node a connection's verified peer certificate names.
pub fn peer_node_id(certificates: Option<&[CertificateDer<'static>]>) -> Option<u64> {
    node_id_of(certificates?.first()?)
}

/// aws-lc-rs with TLS 1.3's AES-128-GCM first: brokers encrypt every replicated byte once
/// per follower, and AES-128 costs about a third less CPU than AES-256 for a margin no attack
/// on a cluster's links comes near. Both ends are ours, so the first suite is the one used.
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    let preferred = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    provider.cipher_suites.retain(|suite| suite.suite() != preferred.suite());
    provider.cipher_suites.insert(0, preferred);
    Arc::new(provider)
}

fn build(files: &ClusterFiles, stamps: FileStamps) -> Result<Loaded, TlsError> {
    let chain = certificates(&files.node_cert)?;
    let node_id =
        node_id_of(&chain[0]).ok_or(TlsError::NoNode { path: files.node_cert.clone() })?;
    let key = PrivateKeyDer::from_pem_file(&files.node_key)
        .map_err(|error| file_error(&files.node_key, error))?;
    let mut roots = RootCertStore::empty();
    for certificate in certificates(&files.ca_cert)? {
        roots.add(certificate).map_err(|error| file_error(&files.ca_cert, error))?;
    }
    let roots = Arc::new(roots);
    let provider = provider();
    let webpki =
        WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(config_error)?;
    let client = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeCertificate { webpki }))
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(config_error)?;
    // A caller without a certificate is a stranger (it may only enroll); one with a
    // certificate must present one of this CA.
    let client_verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider))
        .allow_unauthenticated()
        .build()
        .map_err(config_error)?;
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain, key)
        .map_err(config_error)?;
    Ok(Loaded {
        stamps,
        node_id,
        connector: TlsConnector::from(Arc::new(client)),
        acceptor: TlsAcceptor::from(Arc::new(server)),
    })
}

/// Checks a broker's certificate against the cluster CA and the node the caller dialled: the
/// server name is `node-<id>` for a known node, [`ANY_NODE`] for an address.
#[derive(Debug)]
struct NodeCertificate {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for NodeCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let bad = |detail: &str| rustls::Error::General(detail.to_string());
        let named = node_id_of(end_entity).ok_or_else(|| bad("the certificate names no node"))?;
        if let ServerName::DnsName(name) = server_name
            && let Some(dialled) = node_id_from_name(name.as_ref())
            && dialled != named
        {
            return Err(bad(&format!("the certificate is node {named}'s, not node {dialled}'s")));
        }
        let name = ServerName::try_from(node_name(named)).expect("node names are DNS names");
        self.webpki.verify_server_cert(end_entity, intermediates, &name, ocsp, now).map_err(
            |error| match error {
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => {
                    bad(&format!(
                        "node {named}'s certificate is not signed by this cluster's CA: a \
                         broker of another cluster, or an impostor"
                    ))
                }
                other => other,
            },
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, certificate, signed)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, certificate, signed)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A stranger's check of the seed: any certificate, as long as the handshake is signed by its
/// key (the token proofs authenticate the seed).
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, certificate, signed, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, certificate, signed, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// What changes when a file is rewritten or replaced: device, inode, length, modification and
/// change times. Both TLS ports reload their files when their stamps differ from the ones
/// last tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    device: u64,
    inode: u64,
    bytes: u64,
    modified_ns: i128,
    changed_ns: i128,
}

/// The stamps of a set of files, in order (`None` for one that cannot be read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStamps(Vec<Option<FileStamp>>);

impl FileStamps {
    pub fn of<'a>(paths: impl IntoIterator<Item = &'a Path>) -> FileStamps {
        let nanos =
            |seconds: i64, nanos: i64| i128::from(seconds) * 1_000_000_000 + i128::from(nanos);
        let stamp = |path: &Path| {
            let meta = std::fs::metadata(path).ok()?;
            Some(FileStamp {
                device: meta.dev(),
                inode: meta.ino(),
                bytes: meta.len(),
                modified_ns: nanos(meta.mtime(), meta.mtime_nsec()),
                changed_ns: nanos(meta.ctime(), meta.ctime_nsec()),
            })
        };
        FileStamps(paths.into_iter().map(stamp).collect())
    }
}

fn stamps(files: &ClusterFiles) -> FileStamps {
    FileStamps::of([files.ca_cert.as_path(), &files.node_cert, &files.node_key])
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(path, error))?;
    if chain.is_empty() {
        return Err(file_error(path, "no certificate in the file"));
    }
    Ok(chain)
}

fn file_error(path: &Path, detail: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_path_buf(), detail: detail.to_string() }
}

fn config_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Config(error.to_string())
}
