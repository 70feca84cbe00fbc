//! TLS to Redis: `rediss://` URLs, with `[redis] tls_ca_file` (the authorities that sign the servers'
//! certificates) and `tls_cert_file` + `tls_key_file` (a client certificate, for `tls-auth-clients yes`). The
//! files are read and parsed when the configuration is checked (so `check-config` names a bad one) and again
//! when the store is made, into the redis crate's `TlsCertificates`, which its rustls connections use for one
//! server, each cluster node, and the Sentinels and the master they name.

use std::path::Path;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{redact_url, RedisConfig};
use crate::rule::FieldError;

impl RedisConfig {
    /// The certificates the `tls_*` files give, read and parsed now; `None` when none is set (a `rediss://`
    /// URL then trusts the system's roots).
    ///
    /// # Errors
    /// The field and why, naming the file: one that cannot be read or holds no PEM certificate (or key), or
    /// a certificate without its key (or the other way round).
    pub(crate) fn tls_certificates(&self) -> Result<Option<TlsCertificates>, FieldError> {
        let client_tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) => None,
            (Some(_), None) => {
                return Err((
                    "tls_key_file",
                    "is required with `tls_cert_file`: the client certificate's key".into(),
                ))
            }
            (None, Some(_)) => {
                return Err((
                    "tls_cert_file",
                    "is required with `tls_key_file`: the key's certificate".into(),
                ))
            }
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: certificates(cert, "tls_cert_file")?,
                client_key: private_key(key)?,
            }),
        };
        let root_cert = match &self.tls_ca_file {
            Some(ca) => Some(trust_anchors(ca)?),
            None => None,
        };
        Ok((client_tls.is_some() || root_cert.is_some()).then_some(TlsCertificates { client_tls, root_cert }))
    }

    /// Checks the TLS files (see [`Self::tls_certificates`]) and that, when one is set, every URL is a
    /// `rediss://` one (the files would be ignored otherwise).
    ///
    /// # Errors
    /// The field and why.
    pub(super) fn check_tls(&self) -> Result<(), FieldError> {
        if self.tls_certificates()?.is_none() {
            return Ok(());
        }
        let (field, urls) = self.urls();
        match urls.into_iter().find(|url| !url.starts_with("rediss://")) {
            Some(url) => Err((
                field,
                format!(
                    "`{}` is not a rediss:// URL, but TLS files are set (`tls_ca_file`, `tls_cert_file`): they apply \
                     to rediss:// URLs",
                    redact_url(url)
                ),
            )),
            None => Ok(()),
        }
    }
}

/// The bytes of the file `path`, or why not.
fn read(path: &Path, field: &'static str) -> Result<Vec<u8>, FieldError> {
    std::fs::read(path).map_err(|e| (field, format!("cannot read `{}`: {e}", path.display())))
}

/// The PEM certificates of `path` (at least one), as read.
fn certificates(path: &Path, field: &'static str) -> Result<Vec<u8>, FieldError> {
    let pem = read(path, field)?;
    let bad = |why: String| (field, format!("`{}` {why}", path.display()));
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("is not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)".into()));
    }
    Ok(pem)
}

/// The certificate authorities of `path`, each a trust anchor rustls accepts, as read.
fn trust_anchors(path: &Path) -> Result<Vec<u8>, FieldError> {
    let pem = certificates(path, "tls_ca_file")?;
    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        store.add(cert).map_err(|e| {
            let why = format!(
                "`{}` holds a certificate that is not a valid authority: {e}",
                path.display()
            );
            ("tls_ca_file", why)
        })?;
    }
    Ok(pem)
}

/// The private key of `path` (PKCS#8, PKCS#1 or SEC1 PEM), as read.
fn private_key(path: &Path) -> Result<Vec<u8>, FieldError> {
    let pem = read(path, "tls_key_file")?;
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(_) => Ok(pem),
        Err(e) => Err((
            "tls_key_file",
            format!("`{}` holds no PEM private key: {e}", path.display()),
        )),
    }
}
