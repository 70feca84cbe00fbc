//! The oldest Redis the scripts run on, checked when the store connects to a server (`INFO server`, read beside
//! the `maxmemory-policy` in `eviction.rs`).
//!
//! The scripts read the server's clock (`TIME`) and then write. Redis replicates a script by its effects, which
//! allows that, by default only from 5.0 on; before, such a script is refused ("Write commands not allowed after
//! non deterministic commands") or, with `lua-replicate-commands` off, replicated as a script whose `TIME` reads
//! another clock on the replica. So a server older than 5.0 is refused at connect, with its version named.

/// The oldest version the scripts support, `(major, minor)`.
pub(crate) const OLDEST: (u32, u32) = (5, 0);

/// The `redis_version` field of an `INFO server` reply (`"7.0.15"`), `None` when absent.
pub(crate) fn of_info(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
}

/// Why a server of `version` cannot run the scripts, or `None` when it can (or the version does not parse:
/// a fork that reports something else is given the benefit of the doubt).
pub(crate) fn unsupported(version: &str) -> Option<String> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
        return None;
    };
    ((major, minor) < OLDEST).then(|| {
        format!(
            "Redis {version} is older than {}.{}, the oldest the scripts run on (they read TIME, then write); \
             upgrade the server",
            OLDEST.0, OLDEST.1
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{of_info, unsupported};

    #[test]
    fn servers_before_5_0_are_refused_with_their_version() {
        let info = "# Server\r\nredis_version:4.0.14\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(of_info(info), Some("4.0.14"));
        let why = unsupported("4.0.14").expect("too old");
        assert!(why.contains("4.0.14") && why.contains("5.0"), "{why}");
        assert!(unsupported("3.2.12").is_some());
        for fine in [
            "5.0.0",
            "5.0.14",
            "6.2.7",
            "7.0.15",
            "7.4.1",
            "8.0.0",
            "255.255.255",
            "unknown",
        ] {
            assert_eq!(unsupported(fine), None, "{fine}");
        }
        assert_eq!(of_info("# Server\r\nos:Linux\r\n"), None);
    }
}
