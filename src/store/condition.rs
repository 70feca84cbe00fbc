//! What the operator is told of the Redis store: a WARN line each time its condition changes, from the first
//! call or connection on: it answers, or it does not and why, in words (authentication, TLS, refused, no answer).
//! A store that cannot be reached otherwise shows only in `/readyz` and in `source = "fallback"` answers.
//!
//! The calls and the connection checks of the eviction watch (`eviction.rs`, which connects on its own with the
//! longer connection timeout and so sees a handshake's real error where a call sees only its timeout) both report
//! here. A failure of a more telling kind replaces a vaguer one (a call's timeout, then the connection's
//! `AuthenticationFailed`), never the other way, so the log does not flap between them; the hot path of a store
//! that answers costs one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{StoreError, StoreErrorKind};

/// Why the store fails, from the vaguest to the most telling.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cause {
    /// Anything else: the store's own words.
    Other(String),
    /// No answer within the timeout.
    Timeout(String),
    /// Nothing listens at the address.
    Refused(String),
    /// The TLS handshake failed: the certificate, or no TLS on the other side.
    Tls(String),
    /// The password (or user) was refused.
    Auth(String),
}

impl Cause {
    /// The cause of `error`, read from its kind and its words (the redis crate's and rustls's messages).
    pub(crate) fn of(error: &StoreError) -> Self {
        let message = error.message.clone();
        let lower = message.to_ascii_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
        if has(&[
            "authenticationfailed",
            "wrongpass",
            "noauth",
            "invalid password",
            "invalid username",
        ]) {
            Self::Auth(message)
        } else if has(&[
            "certificate",
            "tls",
            "handshake",
            "corrupt message",
            "unknownissuer",
            "ssl",
        ]) {
            Self::Tls(message)
        } else if has(&["connection refused"]) {
            Self::Refused(message)
        } else if error.kind == StoreErrorKind::Timeout || has(&["timed out", "no answer within"]) {
            Self::Timeout(message)
        } else {
            Self::Other(message)
        }
    }

    /// The cause in words, with what to do; `tls` says the URL is `rediss://`.
    fn words(&self, tls: bool) -> String {
        match self {
            Self::Auth(m) => format!(
                "authentication failed ({m}): the password (or user) in the URL is wrong or missing; check `[redis] \
                 url` against the server's `requirepass` or ACL"
            ),
            Self::Tls(m) if m.contains("CaUsedAsEndEntity") => format!(
                "TLS: the server's certificate is an authority (CA:TRUE) used as its own leaf, which rustls refuses \
                 ({m}); make a CA and a server certificate it signs (as Redis's `utils/gen-test-certs.sh` does) and \
                 give the CA as `tls_ca_file`"
            ),
            Self::Tls(m) => format!(
                "TLS ({m}): check `tls_ca_file` (the authority that signed the server's certificate), the name or \
                 address in the URL against the certificate's, and that the port serves TLS"
            ),
            Self::Refused(m) => format!("connection refused ({m}): nothing listens at that address; is Redis up?"),
            Self::Timeout(m) if tls => format!(
                "no answer ({m}) over TLS: is the server serving TLS on that port? A plain Redis behind a \
                 `rediss://` URL never completes the handshake; or the server or the network is down or slow"
            ),
            Self::Timeout(m) => format!("no answer ({m}): the server or the network is down, frozen or slow"),
            Self::Other(m) => m.clone(),
        }
    }
}

/// The store's condition as last told to the operator, stepped by [`Told::step`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Told {
    /// Nothing told yet: no call or connection has ended.
    #[default]
    Unknown,
    /// It answers.
    Answering,
    /// It fails, for this cause.
    Failing(Cause),
}

/// What happened to a call or a connection check of the store.
#[derive(Debug)]
enum Event {
    Answered,
    Failed(Cause),
}

/// What to log after a step.
#[derive(Debug, PartialEq, Eq)]
enum Log {
    /// It answers again after failing.
    AnswersAgain,
    /// It fails, for a cause not told yet (the first, or a more telling one).
    Fails,
}

impl Told {
    /// The condition after `event`, and what to log. A failure replaces a vaguer cause, never a more telling
    /// one, so the log does not flap between a call's timeout and the connection's reason.
    fn step(self, event: Event) -> (Self, Option<Log>) {
        match (self, event) {
            (Self::Failing(_), Event::Answered) => (Self::Answering, Some(Log::AnswersAgain)),
            (_, Event::Answered) => (Self::Answering, None),
            (Self::Failing(told), Event::Failed(new)) if told >= new => (Self::Failing(told), None),
            (_, Event::Failed(new)) => (Self::Failing(new), Some(Log::Fails)),
        }
    }
}

/// The store's condition as last told, and the server it was told of.
#[derive(Debug, Default)]
pub(crate) struct Condition {
    /// The condition and the server last connected to (for the log).
    told: Mutex<(Told, String)>,
    /// Whether `told` is [`Told::Answering`], written under its lock: the hot path of a store that answers reads
    /// only this.
    answering: AtomicBool,
    /// The store is reached over TLS (`rediss://`).
    tls: AtomicBool,
}

impl Condition {
    /// The store's server is `server` (`host:port`, for the log), reached over TLS when `tls`: a timeout may
    /// then be a handshake that never completes.
    pub(crate) fn connecting(&self, server: &str, tls: bool) {
        self.tls.store(tls, Ordering::Relaxed);
        server.clone_into(&mut self.lock().1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Told, String)> {
        self.told.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store answered.
    #[inline]
    pub(crate) fn answered(&self) {
        if self.answering.load(Ordering::Acquire) {
            return;
        }
        self.step(Event::Answered);
    }

    /// The store failed with `error`. Logs at WARN when it answered before (or never did), or when the cause is
    /// more telling than the one told. A call's own error (a script's bad arguments) is not the store's: ignored.
    pub(crate) fn failed(&self, error: &StoreError) {
        let cause = Cause::of(error);
        if error.kind == StoreErrorKind::Other && matches!(cause, Cause::Other(_)) {
            return;
        }
        self.step(Event::Failed(cause));
    }

    /// Steps the condition by `event` under its lock and logs what changed.
    fn step(&self, event: Event) {
        let mut told = self.lock();
        let (state, server) = &mut *told;
        let (next, log) = std::mem::take(state).step(event);
        self.answering.store(next == Told::Answering, Ordering::Release);
        match (&next, log) {
            (_, Some(Log::AnswersAgain)) => {
                tracing::warn!(%server, "the Redis store answers again: decisions come from it, not from fail_mode");
            }
            (Told::Failing(cause), Some(Log::Fails)) => {
                let words = cause.words(self.tls.load(Ordering::Relaxed));
                tracing::warn!(
                    %server,
                    "the Redis store cannot be used: {words}; decisions follow fail_mode until it answers (see /readyz)"
                );
            }
            _ => {}
        }
        *state = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: StoreErrorKind, message: &str) -> StoreError {
        StoreError {
            kind,
            script: "token_bucket",
            message: message.into(),
            source: None,
        }
    }

    #[test]
    fn each_failure_is_put_in_words() {
        let of = |kind, m| Cause::of(&error(kind, m));
        let auth = of(
            StoreErrorKind::Other,
            "Password authentication failed - AuthenticationFailed",
        );
        assert!(matches!(auth, Cause::Auth(_)));
        assert!(auth.words(false).contains("password"));
        let ca = of(
            StoreErrorKind::Io,
            "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))",
        );
        assert!(ca.words(true).contains("CA:TRUE") && ca.words(true).contains("gen-test-certs.sh"));
        assert!(matches!(
            of(StoreErrorKind::Io, "Connection refused (os error 111)"),
            Cause::Refused(_)
        ));
        let timeout = of(StoreErrorKind::Timeout, "no answer within 50ms");
        assert!(timeout.words(true).contains("plain Redis behind a `rediss://`"));
        assert!(!timeout.words(false).contains("rediss"));
        assert!(matches!(of(StoreErrorKind::Other, "ERR something"), Cause::Other(_)));
    }

    #[test]
    fn the_condition_steps_by_answers_and_failures() {
        let timeout = || Cause::Timeout("no answer within 50ms".into());
        let auth = || Cause::Auth("AuthenticationFailed".into());
        let failed = |c| Event::Failed(c);
        // state x event -> state, log
        let table = [
            (Told::Unknown, Event::Answered, Told::Answering, None),
            (
                Told::Unknown,
                failed(timeout()),
                Told::Failing(timeout()),
                Some(Log::Fails),
            ),
            (Told::Answering, Event::Answered, Told::Answering, None),
            (
                Told::Answering,
                failed(timeout()),
                Told::Failing(timeout()),
                Some(Log::Fails),
            ),
            (
                Told::Failing(timeout()),
                Event::Answered,
                Told::Answering,
                Some(Log::AnswersAgain),
            ),
            (
                Told::Failing(timeout()),
                failed(auth()),
                Told::Failing(auth()),
                Some(Log::Fails),
            ),
            (Told::Failing(auth()), failed(timeout()), Told::Failing(auth()), None),
            (Told::Failing(auth()), failed(auth()), Told::Failing(auth()), None),
        ];
        for (from, event, to, log) in table {
            let said = format!("{from:?} + {event:?}");
            assert_eq!(from.step(event), (to, log), "{said}");
        }
    }

    #[test]
    fn a_more_telling_cause_replaces_a_vaguer_one_never_the_reverse() {
        let condition = Condition::default();
        let timeout = error(StoreErrorKind::Timeout, "no answer within 50ms");
        let auth = error(StoreErrorKind::Other, "AuthenticationFailed");
        condition.failed(&timeout);
        condition.failed(&auth);
        condition.failed(&timeout);
        assert!(
            matches!(condition.lock().0, Told::Failing(Cause::Auth(_))),
            "{:?}",
            condition.lock()
        );
        condition.answered();
        assert_eq!(condition.lock().0, Told::Answering);
        assert!(condition.answering.load(Ordering::Acquire));
        condition.failed(&timeout);
        assert!(
            matches!(condition.lock().0, Told::Failing(Cause::Timeout(_))),
            "{:?}",
            condition.lock()
        );
        assert!(!condition.answering.load(Ordering::Acquire));
        // A script's own error is not the store's.
        condition.answered();
        condition.failed(&error(StoreErrorKind::Other, "ERR token_bucket: bad arguments"));
        assert_eq!(condition.lock().0, Told::Answering);
    }
}
