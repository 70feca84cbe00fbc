//! A password in a Redis URL is never shown: not by `check-config`, not in a `Debug` of the configuration, not in
//! the errors of a store that cannot be reached (port 1 refuses) or of a bad configuration, not in the logs.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokenlease::{Config, Limiter};

mod common;

use common::redaction::{assert_redacted, configs, SECRET};

#[test]
fn the_debug_of_a_config_redacts_its_passwords() {
    for (name, text) in configs() {
        let config = Config::from_toml(&text).expect("config");
        assert_redacted(name, &format!("{config:?}"));
        assert_redacted(name, &format!("{:?}", config.redis.expect("[redis]")));
    }
}

#[test]
fn config_errors_redact_the_urls_they_quote() {
    let cases = [
        // A parse error quotes the line.
        format!("[redis]\nsentinel = {{ nodes = [\"redis://u:{SECRET}@127.0.0.1:1\"] }}\n"),
        format!("[redis]\nurl = \"redis://u:{SECRET}@127.0.0.1:1/0\", timeout = 1\n"),
        // A URL the redis crate refuses is named.
        format!("[redis]\nurl = \"redis://u:{SECRET}@127.0.0.1:notaport/0\"\n"),
        format!("[redis]\ncluster = [\"http://u:{SECRET}@127.0.0.1:1\"]\n"),
    ];
    for text in cases {
        let error = Config::from_toml(&text).expect_err("invalid");
        assert!(!error.to_string().contains(SECRET), "{error}");
        assert!(!format!("{error:?}").contains(SECRET), "{error:?}");
    }
}

/// The bytes the subscriber writes, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// On the current thread: the store's background tasks run under the test's subscriber.
#[tokio::test]
async fn store_errors_and_logs_redact_the_passwords() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    for (name, text) in configs() {
        let config = Config::from_toml(&text).expect("config");
        let limiter = Limiter::from_config(config.clone()).expect("a store is built while Redis is down");
        assert_redacted(
            &format!("{name}: the limiter's Debug"),
            &format!("{limiter:?} {config:?}"),
        );
        let decision = limiter.check("r", "k", 1).await.expect("fail_mode decides");
        assert!(!decision.allowed, "{name}: fail_mode closed");
        let error = limiter.ping().await.expect_err("nothing listens on port 1");
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(SECRET), "{name}: {shown}");
        // real time: lets the store's connection tasks retry (and log) their real connections to port 1 a while.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(limiter);

        // The start-up check of the eviction policy names the server it cannot reach.
        let mut strict = config;
        if let Some(redis) = strict.redis.as_mut() {
            redis.require_noeviction = true;
        }
        let error = Limiter::from_config(strict).expect_err("nothing listens on port 1");
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(SECRET), "{name}: {shown}");
    }
    let log = String::from_utf8_lossy(&log.0.lock().expect("log")).into_owned();
    assert!(log.contains("127.0.0.1"), "the log does not name the server: {log}");
    assert!(!log.contains(SECRET), "the log shows the password: {log}");
}
