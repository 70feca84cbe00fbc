//! A store that cannot be used says why (issue 22, item 1): `tokenlease serve` logs, at its default level, a WARN
//! line with the cause in words when Redis refuses its password, when a plain Redis sits behind a `rediss://` URL,
//! when the server's certificate is a CA used as its own leaf (redis-cli accepts it, rustls refuses it), and when
//! nothing listens; and again when the store answers. stderr is a file here: no colour codes in it.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::RedisServer;
use serve::Serve;

const RULE: &str = "[[rule]]\nname = \"a\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\n";

/// `tokenlease serve` on `redis` (the `[redis]` keys), its stderr in a file, killed on drop.
struct Sidecar(Serve);

impl Sidecar {
    fn start(redis: &str) -> Self {
        let port = common::free_port();
        Self(Serve::spawn(&format!("[redis]\n{redis}{RULE}"), &[], |c| {
            c.args(["--listen", &format!("127.0.0.1:{port}")])
                .env_remove("RUST_LOG");
        }))
    }

    fn log(&self) -> String {
        self.0.log()
    }

    /// The first WARN line holding every one of `words`, waited for (real time: the sidecar connects on its own)
    /// up to 20 s.
    fn warned(&self, words: &[&str]) -> String {
        let line = common::wait_for(Duration::from_secs(20), || {
            let log = self.log();
            log.lines()
                .find(|l| l.contains(" WARN ") && words.iter().all(|w| l.contains(w)))
                .map(str::to_owned)
        });
        let log = self.log();
        assert!(
            !log.contains('\u{1b}'),
            "colour codes in a log that is not a terminal: {log}"
        );
        line.unwrap_or_else(|| panic!("no WARN line with {words:?}: {log}"))
    }
}

#[test]
fn a_wrong_password_is_named() {
    let server = RedisServer::start();
    server.cmd(&["CONFIG", "SET", "requirepass", "secret"]);
    let serve = Sidecar::start(&format!("url = \"redis://:wrong@127.0.0.1:{}\"\n", server.port));
    let line = serve.warned(&["cannot be used", "authentication failed", "password"]);
    assert!(!line.contains("wrong@"), "the password is never shown: {line}");
}

#[test]
fn a_plain_redis_behind_rediss_is_named() {
    let server = RedisServer::start();
    let serve = Sidecar::start(&format!("url = \"rediss://127.0.0.1:{}\"\n", server.port));
    serve.warned(&["cannot be used", "over TLS", "plain Redis behind a `rediss://` URL"]);
}

#[test]
fn a_ca_used_as_its_own_leaf_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_ca_leaf(dir.path());
    let path = |p: &PathBuf| p.display().to_string();
    let tls = common::Tls {
        settings: vec![
            ("tls-cert-file".into(), path(&cert)),
            ("tls-key-file".into(), path(&key)),
            ("tls-ca-cert-file".into(), path(&cert)),
            ("tls-auth-clients".into(), "no".into()),
        ],
        cli: vec!["--tls".into(), "--cacert".into(), path(&cert)],
    };
    // redis-cli accepts it: the server answers PING over TLS.
    let server = RedisServer::start_tls(Some(tls), &[]);
    let serve = Sidecar::start(&format!(
        "url = \"rediss://127.0.0.1:{}\"\ntls_ca_file = {:?}\n",
        server.port,
        path(&cert)
    ));
    serve.warned(&["cannot be used", "CA:TRUE", "CaUsedAsEndEntity", "gen-test-certs.sh"]);
}

#[test]
fn nothing_listening_is_named_and_the_store_coming_back_is_told() {
    let mut server = RedisServer::start();
    server.stop();
    let serve = Sidecar::start(&format!("url = \"redis://127.0.0.1:{}\"\n", server.port));
    serve.warned(&["cannot be used", "connection refused"]);
    server.restart();
    serve.warned(&["answers again"]);
}

/// A certificate for `127.0.0.1` that is its own authority (`CA:TRUE`, self-signed), as `openssl req -x509` makes
/// by default, and its key, as PEM files in `dir`.
fn self_signed_ca_leaf(dir: &Path) -> (PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed");
    let (cert_path, key_path) = (dir.join("self.pem"), dir.join("self-key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}
