//! The cluster's own certificate authority, its node certificates and the join token
//! (docs/security.md, "Between brokers").
//!
//! The broker that creates a cluster generates a CA and a join token. A broker that joins proves
//! it knows the token, bound to its TLS session with the seed (an exporter value both ends
//! compute, so a man in the middle, who holds two sessions, can relay neither proof), and is
//! given a node certificate whose only name is `node-<id>.malachi.internal`: from then on the
//! certificate, not anything a peer says, is which node is at the other end of a connection.
//! The CA's key travels with it, so that any member can admit the next broker.
//!
//! Files, under `<data dir>/cluster/`, keys and token readable by the broker's user alone:
//! `ca.crt`, `ca.key`, `node.crt`, `node.key`, `token`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The DNS name a node certificate carries: `node-<id>` under this domain, never resolved.
pub const NODE_NAME_DOMAIN: &str = "malachi.internal";
/// An operator's token is at least this long; a generated one is 64 hexadecimal digits.
pub const TOKEN_CHARS_MIN: usize = 32;
/// Random bytes in a generated token (256 bits).
const TOKEN_RANDOM_BYTES: usize = 32;
/// What each side of an enrollment signs with the token, so neither proof answers the other.
pub const JOINER_ROLE: &[u8] = b"malachi enroll: joiner";
pub const SEED_ROLE: &[u8] = b"malachi enroll: seed";
/// The TLS exporter label of the value both proofs are bound to.
pub const BINDING_LABEL: &[u8] = b"EXPORTER-malachi-cluster-enrollment";

/// Why the cluster's certificates or token could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "the cluster token has {chars} characters; MALACHI_CLUSTER_TOKEN needs at least \
         {TOKEN_CHARS_MIN}"
    )]
    ShortToken { chars: usize },
}

/// `node-<id>.malachi.internal`.
pub fn node_name(node_id: u64) -> String {
    format!("node-{node_id}.{NODE_NAME_DOMAIN}")
}

/// The node id a node name carries.
pub fn node_id_from_name(name: &str) -> Option<u64> {
    let id = name.strip_prefix("node-")?.strip_suffix(NODE_NAME_DOMAIN)?.strip_suffix('.')?;
    if id.starts_with('+') || (id.len() > 1 && id.starts_with('0')) {
        return None;
    }
    id.parse().ok()
}

/// The node id a certificate names, if it names exactly one (its DNS subject alternative
/// names). A certificate the CA did not sign is checked by rustls before this is asked.
pub fn node_id_of(certificate: &CertificateDer<'_>) -> Option<u64> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let names = parsed.subject_alternative_name().ok()??;
    let mut ids = names.value.general_names.iter().filter_map(|name| match name {
        GeneralName::DNSName(dns) => node_id_from_name(dns),
        _ => None,
    });
    let id = ids.next()?;
    ids.next().is_none().then_some(id)
}

/// A new join token: 256 random bits as hexadecimal.
pub fn generate_token() -> String {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut bytes).expect("the operating system has no random source");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// An operator's token is long enough to be a secret.
pub fn check_token(token: &str) -> Result<(), PkiError> {
    let chars = token.chars().count();
    if chars < TOKEN_CHARS_MIN { Err(PkiError::ShortToken { chars }) } else { Ok(()) }
}

/// One side's proof that it knows `token`, bound to the TLS session (`binding`).
pub fn proof(token: &str, role: &[u8], binding: &[u8; 32]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(role);
    mac.update(binding);
    mac.finalize().into_bytes().into()
}

/// Whether `claimed` is the proof of `role` for this session; compared in constant time.
pub fn proof_matches(token: &str, role: &[u8], binding: &[u8; 32], claimed: &[u8]) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(role);
    mac.update(binding);
    mac.verify_slice(claimed).is_ok()
}

/// A certificate and its private key, PEM.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Credentials {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Credentials").field("key_pem", &"<secret>").finish_non_exhaustive()
    }
}

/// The cluster's certificate authority.
#[derive(Clone, Debug)]
pub struct ClusterCa {
    pub cluster_id: String,
    pub credentials: Credentials,
}

impl ClusterCa {
    /// A new CA for cluster `cluster_id`.
    pub fn generate(cluster_id: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::generate()?;
        let certificate = ca_params(cluster_id).self_signed(&key)?;
        let credentials = Credentials { cert_pem: certificate.pem(), key_pem: key.serialize_pem() };
        Ok(ClusterCa { cluster_id: cluster_id.to_string(), credentials })
    }

    /// A certificate for node `node_id`, usable to serve and to call, signed by this CA.
    pub fn issue(&self, node_id: u64) -> Result<Credentials, PkiError> {
        let ca_key = KeyPair::from_pem(&self.credentials.key_pem)?;
        // The issuer's name and key identifier are what chain building matches, and both
        // follow from the parameters and the key this CA was made with.
        let issuer = Issuer::new(ca_params(&self.cluster_id), ca_key);
        let mut params = CertificateParams::new(vec![node_name(node_id)])?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, node_name(node_id));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let certificate = params.signed_by(&key, &issuer)?;
        Ok(Credentials { cert_pem: certificate.pem(), key_pem: key.serialize_pem() })
    }
}

fn ca_params(cluster_id: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, format!("Malachi cluster {cluster_id}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// Where a broker keeps its cluster credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFiles {
    pub ca_cert: PathBuf,
    /// Absent when an operator brings their own certificates: such a broker admits no one.
    pub ca_key: Option<PathBuf>,
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    pub token: Option<PathBuf>,
}

impl ClusterFiles {
    /// The files a broker generates or is given at its join, under `<data dir>/cluster/`.
    pub fn in_data_dir(data_dir: &Path) -> ClusterFiles {
        let dir = data_dir.join("cluster");
        ClusterFiles {
            ca_cert: dir.join("ca.crt"),
            ca_key: Some(dir.join("ca.key")),
            node_cert: dir.join("node.crt"),
            node_key: dir.join("node.key"),
            token: Some(dir.join("token")),
        }
    }

    /// Whether the node's certificate is there (the broker has been enrolled or created).
    pub fn exist(&self) -> bool {
        self.node_cert.exists() && self.node_key.exists() && self.ca_cert.exists()
    }

    /// Writes a new broker's credentials: the CA (with its key), its node certificate and the
    /// token; keys and token readable by this user alone, each file synced, then the directory.
    pub fn write(&self, ca: &Credentials, node: &Credentials, token: &str) -> Result<(), PkiError> {
        let dir = self.node_cert.parent().expect("files live in a directory");
        std::fs::create_dir_all(dir).map_err(|source| io_error(dir, source))?;
        write_file(&self.ca_cert, &ca.cert_pem, 0o644)?;
        if let Some(path) = &self.ca_key {
            write_file(path, &ca.key_pem, 0o600)?;
        }
        write_file(&self.node_cert, &node.cert_pem, 0o644)?;
        write_file(&self.node_key, &node.key_pem, 0o600)?;
        if let Some(path) = &self.token {
            write_file(path, token, 0o600)?;
        }
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| io_error(dir, source))
    }

    /// The CA's certificate and key, for admitting a broker; `None` for a broker whose
    /// operator brought the certificates.
    pub fn read_ca(&self, cluster_id: &str) -> Result<Option<ClusterCa>, PkiError> {
        let Some(key_path) = self.ca_key.as_ref().filter(|path| path.exists()) else {
            return Ok(None);
        };
        let credentials =
            Credentials { cert_pem: read_file(&self.ca_cert)?, key_pem: read_file(key_path)? };
        Ok(Some(ClusterCa { cluster_id: cluster_id.to_string(), credentials }))
    }

    /// The token this broker used before a rotation (`token.previous` beside the token), whose
    /// gossip it still accepts (docs/security.md, "Rotation").
    pub fn read_previous_token(&self) -> Result<Option<String>, PkiError> {
        let previous = self.token.as_ref().map(|path| path.with_extension("previous"));
        match previous.filter(|path| path.exists()) {
            Some(path) => Ok(Some(read_file(&path)?.trim().to_string())),
            None => Ok(None),
        }
    }

    /// The join token this broker checks joiners against, if it keeps one.
    pub fn read_token(&self) -> Result<Option<String>, PkiError> {
        match self.token.as_ref().filter(|path| path.exists()) {
            Some(path) => Ok(Some(read_file(path)?.trim().to_string())),
            None => Ok(None),
        }
    }
}

fn read_file(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| io_error(path, source))
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), PkiError> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .map_err(|source| io_error(&temporary, source))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(&temporary, source))?;
    std::fs::rename(&temporary, path).map_err(|source| io_error(path, source))
}

fn io_error(path: &Path, source: std::io::Error) -> PkiError {
    PkiError::Io { path: path.to_path_buf(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_carry_exactly_one_id() {
        let cases = [
            ("node-1.malachi.internal", Some(1)),
            ("node-18446744073709551615.malachi.internal", Some(u64::MAX)),
            ("node-01.malachi.internal", None),
            ("node-+1.malachi.internal", None),
            ("node-.malachi.internal", None),
            ("node-1.malachi.internal.evil", None),
            ("node-1xmalachi.internal", None),
            ("node-1", None),
            ("broker-1.malachi.internal", None),
        ];
        for (name, id) in cases {
            assert_eq!(node_id_from_name(name), id, "{name}");
        }
        assert_eq!(node_id_from_name(&node_name(42)), Some(42));
    }

    #[test]
    fn the_ca_issues_node_certificates_naming_their_node() {
        let ca = ClusterCa::generate("c1").unwrap();
        let node = ca.issue(7).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(node.cert_pem.as_bytes());
        let certificate: CertificateDer<'_> = der.unwrap();
        assert_eq!(node_id_of(&certificate), Some(7));
        let ca_der: CertificateDer<'_> =
            rustls_pki_types::pem::PemObject::from_pem_slice(ca.credentials.cert_pem.as_bytes())
                .unwrap();
        assert_eq!(node_id_of(&ca_der), None, "the CA is no node");
    }

    #[test]
    fn proofs_are_bound_to_token_role_and_session() {
        let token = generate_token();
        assert_eq!(token.len(), 64);
        check_token(&token).unwrap();
        assert!(matches!(check_token("short"), Err(PkiError::ShortToken { chars: 5 })));
        let binding = [7u8; 32];
        let joiner = proof(&token, JOINER_ROLE, &binding);
        assert!(proof_matches(&token, JOINER_ROLE, &binding, &joiner));
        assert!(!proof_matches(&token, SEED_ROLE, &binding, &joiner), "another role");
        assert!(!proof_matches(&token, JOINER_ROLE, &[8u8; 32], &joiner), "another session");
        assert!(!proof_matches(&generate_token(), JOINER_ROLE, &binding, &joiner));
        assert!(!proof_matches(&token, JOINER_ROLE, &binding, &joiner[..31]), "cut short");
    }

    #[test]
    fn files_are_written_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let files = ClusterFiles::in_data_dir(dir.path());
        assert!(!files.exist());
        let ca = ClusterCa::generate("c1").unwrap();
        let node = ca.issue(1).unwrap();
        files.write(&ca.credentials, &node, "t".repeat(40).as_str()).unwrap();
        assert!(files.exist());
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(files.ca_key.as_ref().unwrap()), 0o600);
        assert_eq!(mode(&files.node_key), 0o600);
        assert_eq!(mode(files.token.as_ref().unwrap()), 0o600);
        assert_eq!(files.read_token().unwrap().unwrap(), "t".repeat(40));
        assert_eq!(files.read_ca("c1").unwrap().unwrap().credentials, ca.credentials);
    }
}
