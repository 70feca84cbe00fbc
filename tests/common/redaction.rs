//! Configs naming the store with passwords, and the check that a text shows none (tests/redaction.rs and the
//! binary's cli/tests/check_config.rs).

pub const SECRET: &str = "s3cret";
pub const RULE: &str = "[[rule]]\nname = \"r\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 10\nper = \"1s\"\n";

/// The three ways of naming the store, each with passwords, and nothing listening (port 1 refuses).
pub fn configs() -> [(&'static str, String); 3] {
    let redis = "timeout = \"50ms\"\nfail_mode = \"closed\"\n";
    [
        ("url", format!("[redis]\nurl = \"redis://u:{SECRET}@127.0.0.1:1/0\"\n{redis}{RULE}")),
        (
            "cluster",
            format!("[redis]\ncluster = [\"redis://:{SECRET}@127.0.0.1:1\", \"redis://u:{SECRET}@127.0.0.1:2\"]\n{redis}{RULE}"),
        ),
        (
            "sentinel",
            format!(
                "[redis]\nsentinel = {{ master_name = \"m\", nodes = [\"redis://u:{SECRET}@127.0.0.1:1\"] }}\n{redis}{RULE}"
            ),
        ),
    ]
}

pub fn assert_redacted(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the password: {text}");
    assert!(text.contains("127.0.0.1"), "{what} does not name the host: {text}");
}
