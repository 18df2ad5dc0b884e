//! Certificates made in the test (rcgen): a CA, a broker certificate for 127.0.0.1 and
//! localhost, and client certificates with chosen names, written as PEM files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};

/// A certificate authority.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// PEM files of one certificate and its key.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Authority {
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Authority { issuer }
    }

    /// Writes the CA certificate to `path`.
    pub fn write_ca(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.issuer.pem()).unwrap();
        path.to_path_buf()
    }

    /// A broker certificate for 127.0.0.1 and localhost, written as `<stem>.crt`/`<stem>.key`.
    pub fn broker(&self, dir: &Path, stem: &str) -> Pair {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "malachi broker");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.write(params, dir, stem)
    }

    /// A client certificate with this common name and subject alternative names.
    pub fn client(&self, dir: &Path, stem: &str, common_name: &str, names: Vec<SanType>) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.subject_alt_names = names;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.write(params, dir, stem)
    }

    fn write(&self, params: CertificateParams, dir: &Path, stem: &str) -> Pair {
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        let pair =
            Pair { cert: dir.join(format!("{stem}.crt")), key: dir.join(format!("{stem}.key")) };
        std::fs::write(&pair.cert, certificate.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }
}

/// Replaces `to`'s files with `from`'s as an operator rotating a certificate would: write new
/// files beside, then rename over the old ones.
pub fn rotate(from: &Pair, to: &Pair) {
    for (source, target) in [(&from.cert, &to.cert), (&from.key, &to.key)] {
        let staged = target.with_extension("new");
        std::fs::copy(source, &staged).unwrap();
        std::fs::rename(&staged, target).unwrap();
    }
}
