//! Redis URLs as they may be shown: the password of `redis://user:password@host:port/db` (and the `pass` and
//! `password` query parameters of `redis+unix://` URLs) replaced by `***`, wherever a URL is printed, logged, put
//! in an error or in a `Debug`. The URL is parsed by the `url` crate, as the redis crate parses it.

/// What stands for a password.
const MASK: &str = "***";
/// Query parameters that hold a password (`redis+unix:///run/redis.sock?pass=...`, as the redis crate reads them).
const SECRET_PARAMS: [&str; 2] = ["pass", "password"];

/// `url` with its password replaced by `***`, e.g. `redis://user:***@host:6379/0`; the user name, host, port and
/// database stay, so that the URL still says which server is meant. A string that does not parse as a URL keeps
/// only what follows its last `@` (where a password would end), e.g. `redis://***@host:port`.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return match url.rfind('@') {
            Some(at) => {
                let scheme = url.find("://").filter(|&i| i < at).map_or(0, |i| i + 3);
                format!("{}{MASK}{}", &url[..scheme], &url[at..])
            }
            None => url.to_owned(),
        };
    };
    if parsed.password().is_some() && parsed.set_password(Some(MASK)).is_err() {
        return MASK.to_owned();
    }
    if parsed.query_pairs().any(|(k, _)| SECRET_PARAMS.contains(&k.as_ref())) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if SECRET_PARAMS.contains(&k.as_ref()) {
                    MASK.into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// `text` with every URL in it (`scheme://...` up to a space, quote, comma or closing bracket) redacted by
/// [`redact_url`]: for a line of the configuration quoted in an error.
pub(crate) fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || "+-.".contains(c))
            .len();
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || "\"'`,]}".contains(c))
            .map_or(rest.len(), |j| i + j);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_masked_and_the_rest_kept() {
        let cases = [
            ("redis://u:s3cret@127.0.0.1:6379/0", "redis://u:***@127.0.0.1:6379/0"),
            (
                "rediss://:s3cret@cache.example:6380",
                "rediss://:***@cache.example:6380",
            ),
            ("redis://u%40x:s3%2Fcret@h:1/2", "redis://u%40x:***@h:1/2"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://user@127.0.0.1:6379", "redis://user@127.0.0.1:6379"),
            (
                "redis+unix:///run/r.sock?db=1&pass=s3cret",
                "redis+unix:///run/r.sock?db=1&pass=***",
            ),
            ("redis://u:s3cret@h:notaport/0", "redis://***@h:notaport/0"),
            ("not a url", "not a url"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn every_url_in_a_line_is_masked() {
        let line = r#"sentinel = { master_name = "m", nodes = ["redis://:s3cret@a:1", 'redis://u:s3cret@b:2'] }"#;
        assert_eq!(
            redact_text(line),
            r#"sentinel = { master_name = "m", nodes = ["redis://:***@a:1", 'redis://u:***@b:2'] }"#
        );
        assert_eq!(redact_text("no url here"), "no url here");
    }
}
