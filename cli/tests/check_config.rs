//! `tokenlease check-config`: it reports a bad field at its line, a config without a rule and a TLS file that
//! cannot be read, and never prints a password.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::redaction::{assert_redacted, configs};

/// A rule for the TLS config (check-config refuses a file without one).
const TLS_RULE: &str = "[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n";

/// `tokenlease check-config PATH`'s output.
fn check_config(path: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .arg("check-config")
        .arg(path)
        .output()
        .expect("run check-config")
}

#[test]
fn check_config_command_reports_the_error_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[redis]\nurl = \"redis://x\"\ntimeout = \"fast\"\n").expect("write");
    let out = check_config(&path);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timeout") && stderr.contains(":3"), "{stderr}");
    let ok = check_config(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config.toml"
    )));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("rule sku_buy: token_bucket"));
    // A config without a rule parses, but would refuse every call: check-config says so and fails.
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "[redis]\nurl = \"redis://x\"\n").expect("write");
    let out = check_config(&empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("empty.toml: no [[rule]]"),
        "{stderr}"
    );
}

#[test]
fn check_config_prints_no_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in configs() {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).expect("write");
        let out = check_config(&path);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_redacted(&format!("check-config of {name}"), &stdout);
        assert!(stdout.contains(":***@127.0.0.1"), "{stdout}");
    }
}

#[test]
fn check_config_reports_a_bad_tls_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tls.toml");
    let toml = format!(
        "[redis]\nurl = \"rediss://:s3cret@127.0.0.1:6380\"\ntls_ca_file = {:?}\n{TLS_RULE}",
        dir.path().join("absent-ca.pem").display().to_string()
    );
    std::fs::write(&path, toml).expect("write");
    let out = check_config(&path);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tls_ca_file") && stderr.contains("absent-ca.pem"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}
