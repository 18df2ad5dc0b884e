//! TLS towards the broker, with rustls: the broker's certificate is checked against a CA bundle
//! (the configured one, or the system's), and a client certificate can be presented for mTLS
//! login (key 12).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::error::ClientError;

/// Where the system keeps its CA bundle on the distributions we know, tried in order when no
/// CA file is given.
const SYSTEM_CA_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];

/// How to speak TLS to the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM bundle the broker's certificate must chain to; `None` uses the system's bundle.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain and private key presented to the broker (for mTLS).
    pub client_certificate: Option<(PathBuf, PathBuf)>,
    /// The name the broker's certificate must carry; `None` takes the host of the address.
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Connects to `address` and completes the handshake.
    pub(crate) async fn connect(&self, address: &str) -> Result<TlsStream<TcpStream>, ClientError> {
        let connector = TlsConnector::from(self.client_config()?);
        let host = match &self.server_name {
            Some(name) => name.clone(),
            None => host_of(address).to_string(),
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|_| ClientError::Tls(format!("{host:?} is not a valid server name")))?;
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(connector.connect(name, stream).await?)
    }

    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, ClientError> {
        let mut roots = RootCertStore::empty();
        let bundle = match &self.ca_file {
            Some(path) => path.clone(),
            None => {
                SYSTEM_CA_BUNDLES.iter().map(PathBuf::from).find(|path| path.exists()).ok_or_else(
                    || ClientError::Tls("no CA bundle given and none found on the system".into()),
                )?
            }
        };
        for certificate in certificates(&bundle)? {
            roots.add(certificate).map_err(|error| tls_error(&bundle, error))?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let config = match &self.client_certificate {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => {
                let key_der =
                    PrivateKeyDer::from_pem_file(key).map_err(|error| tls_error(key, error))?;
                builder
                    .with_client_auth_cert(certificates(chain)?, key_der)
                    .map_err(|error| tls_error(key, error))?
            }
        };
        Ok(Arc::new(config))
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|error| tls_error(path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| tls_error(path, error))?;
    if chain.is_empty() {
        return Err(ClientError::Tls(format!("{}: no certificate in the file", path.display())));
    }
    Ok(chain)
}

fn tls_error(path: &Path, error: impl std::fmt::Display) -> ClientError {
    ClientError::Tls(format!("{}: {error}", path.display()))
}

/// `host` of `host:port`, `[v6]:port` or a bare host.
fn host_of(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => address,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_is_taken_from_the_address() {
        let cases = [
            ("broker.example:4040", "broker.example"),
            ("127.0.0.1:4040", "127.0.0.1"),
            ("[::1]:4040", "::1"),
            ("broker.example", "broker.example"),
        ];
        for (address, host) in cases {
            assert_eq!(super::host_of(address), host, "{address}");
        }
    }
}
