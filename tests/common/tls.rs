//! Test helper: a certificate authority, a server certificate (SAN `127.0.0.1` and `localhost`, for server and
//! client use, as redis-server also presents it to the servers it connects to) and a client certificate it
//! signs, and another authority that signs nothing here, written as PEM files by rcgen into a directory of the
//! test's own, removed on drop.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use super::server::Tls;

/// The PEM files of a test's TLS.
#[derive(Clone)]
pub struct Certs {
    /// The authority that signs the server's and the client's certificates.
    pub ca: PathBuf,
    /// Another authority, which signs neither.
    pub wrong_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: Arc<tempfile::TempDir>,
}

/// An authority's parameters and key.
fn authority(name: &str) -> (CertificateParams, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params, KeyPair::generate().expect("CA key"))
}

impl Certs {
    /// Generates the authorities and certificates into a new temporary directory.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        let (ca_params, ca_key) = authority("tokenlease test CA");
        let ca = write("ca.pem", ca_params.self_signed(&ca_key).expect("CA").pem());
        let (wrong_params, wrong_key) = authority("another CA");
        let wrong_ca = write("wrong-ca.pem", wrong_params.self_signed(&wrong_key).expect("CA").pem());
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |name: &str, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::new(sans).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &issuer).expect("signed certificate");
            (
                write(&format!("{name}.pem"), cert.pem()),
                write(&format!("{name}-key.pem"), key.serialize_pem()),
            )
        };
        let both = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let (server_cert, server_key) = leaf("server", vec!["127.0.0.1".into(), "localhost".into()], both);
        let (client_cert, client_key) = leaf("client", Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]);
        Self {
            ca,
            wrong_ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
            _dir: Arc::new(dir),
        }
    }

    /// What a redis-server (or Sentinel) serving TLS with these files needs, asking clients for a certificate
    /// only when `client_cert_required` (`tls-auth-clients yes`; `optional` otherwise).
    pub fn server(&self, client_cert_required: bool) -> Tls {
        let path = |p: &PathBuf| p.display().to_string();
        let auth = if client_cert_required { "yes" } else { "optional" };
        Tls {
            settings: vec![
                ("tls-cert-file".into(), path(&self.server_cert)),
                ("tls-key-file".into(), path(&self.server_key)),
                ("tls-ca-cert-file".into(), path(&self.ca)),
                ("tls-auth-clients".into(), auth.into()),
                ("tls-replication".into(), "yes".into()),
            ],
            cli: vec![
                "--tls".into(),
                "--cacert".into(),
                path(&self.ca),
                "--cert".into(),
                path(&self.client_cert),
                "--key".into(),
                path(&self.client_key),
            ],
        }
    }

    /// `[redis]` keys of these files: the authority's, and the client certificate's when `client_cert`.
    pub fn toml(&self, client_cert: bool) -> String {
        let mut keys = format!("tls_ca_file = {:?}\n", self.ca.display().to_string());
        if client_cert {
            keys += &format!(
                "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
                self.client_cert.display().to_string(),
                self.client_key.display().to_string()
            );
        }
        keys
    }
}
