//! `[rule.rls]`: which descriptors of Envoy's Rate Limit Service (RLS v3, `envoy.service.ratelimit.v3`) a rule
//! answers, and the limiter key it takes from them. `tokenlease serve --grpc-listen` serves the protocol; the
//! matching lives here, free of gRPC, so that an embedder serving RLS itself can reuse it.
//!
//! ```toml
//! [rule.rls]
//! domain = "shop"                       # the request's domain
//! match = { generic_key = "checkout" }  # entries that must be present with these values
//! key = ["remote_address"]              # entries whose values, joined with ':', form the limiter key
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rule::FieldError;

/// `[rule.rls]` as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRls {
    domain: String,
    #[serde(default, rename = "match")]
    matches: BTreeMap<String, String>,
    #[serde(default)]
    key: Vec<String>,
}

impl RawRls {
    /// The route of rule `rule`, validated.
    pub(crate) fn route(self, rule: &str) -> Result<RlsRoute, FieldError> {
        if self.domain.is_empty() {
            return Err(("rls.domain", "must not be empty".into()));
        }
        if self.matches.keys().chain(&self.key).any(String::is_empty) {
            return Err(("rls", "descriptor entry names must not be empty".into()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = self.key.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(("rls.key", format!("names the entry `{twice}` twice")));
        }
        Ok(RlsRoute {
            rule: rule.to_owned(),
            domain: self.domain,
            matches: self.matches.into_iter().collect(),
            key: self.key,
        })
    }
}

/// Which RLS descriptors a rule answers (`[rule.rls]`), and how a descriptor becomes the rule's key.
///
/// A descriptor is a list of `(entry, value)` pairs that Envoy builds from a request (`generic_key`,
/// `remote_address`, `header_match`, ...). It matches when the request's domain is [`RlsRoute::domain`], every
/// entry of [`RlsRoute::matches`] is present with its value, and every entry of [`RlsRoute::key`] is present;
/// other entries are ignored. Where an entry name appears twice in a descriptor, its first value counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRoute {
    /// The rule that answers.
    pub rule: String,
    /// The request's `domain` this route answers.
    pub domain: String,
    /// Entries that must be present with these values, sorted by name.
    pub matches: Vec<(String, String)>,
    /// Entries whose values, in this order and joined with `:`, are the limiter key. Empty: every matching
    /// descriptor shares one bucket, keyed by the domain.
    pub key: Vec<String>,
}

impl RlsRoute {
    /// The limiter key of a descriptor whose entries are `entries`, in `domain`; `None` when the route does not
    /// match it. Values are joined as they are: `a:b` + `c` and `a` + `b:c` are one key.
    pub fn key_of<'a>(&self, domain: &str, entries: &[(&'a str, &'a str)]) -> Option<String> {
        if domain != self.domain {
            return None;
        }
        let value = |name: &str| entries.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        if !self.matches.iter().all(|(k, v)| value(k) == Some(v.as_str())) {
            return None;
        }
        if self.key.is_empty() {
            return Some(self.domain.clone());
        }
        let mut key = String::new();
        for (i, name) in self.key.iter().enumerate() {
            if i > 0 {
                key.push(':');
            }
            key.push_str(value(name)?);
        }
        Some(key)
    }
}

/// The first route of `routes` (file order) that matches a descriptor, and the descriptor's key under it.
pub fn rls_match<'r>(routes: &'r [RlsRoute], domain: &str, entries: &[(&str, &str)]) -> Option<(&'r RlsRoute, String)> {
    routes
        .iter()
        .find_map(|route| route.key_of(domain, entries).map(|key| (route, key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(matches: &[(&str, &str)], key: &[&str]) -> RlsRoute {
        RlsRoute {
            rule: "r".into(),
            domain: "shop".into(),
            matches: matches.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            key: key.iter().map(|k| (*k).into()).collect(),
        }
    }

    #[test]
    fn a_descriptor_matches_on_domain_values_and_key_entries() {
        let r = route(&[("generic_key", "checkout")], &["remote_address", "user"]);
        let full = [
            ("generic_key", "checkout"),
            ("remote_address", "10.0.0.1"),
            ("user", "ann"),
            ("x", "y"),
        ];
        assert_eq!(r.key_of("shop", &full).as_deref(), Some("10.0.0.1:ann"));
        assert_eq!(r.key_of("other", &full), None, "another domain");
        let wrong = [("generic_key", "cart"), ("remote_address", "10.0.0.1"), ("user", "ann")];
        assert_eq!(r.key_of("shop", &wrong), None, "a match entry with another value");
        let short = [("generic_key", "checkout"), ("remote_address", "10.0.0.1")];
        assert_eq!(r.key_of("shop", &short), None, "a key entry missing");
        let global = route(&[("generic_key", "checkout")], &[]);
        assert_eq!(global.key_of("shop", &full).as_deref(), Some("shop"));
    }

    fn parse(rls: &str) -> Result<crate::Config, String> {
        let text = format!("[[rule]]\nname = \"c\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\n{rls}");
        crate::Config::from_toml(&text).map_err(|e| e.to_string())
    }

    #[test]
    fn rule_rls_is_parsed_and_checked_with_its_line() {
        let ok = parse("[rule.rls]\ndomain = \"shop\"\nmatch = { generic_key = \"checkout\" }\nkey = [\"ip\"]\n");
        let routes = ok.map(|c| c.rls).unwrap_or_default();
        assert_eq!(
            routes,
            [route(&[("generic_key", "checkout")], &["ip"])].map(|r| RlsRoute { rule: "c".into(), ..r })
        );
        assert_eq!(parse("").map(|c| c.rls.len()), Ok(0));
        let err = |rls: &str| parse(rls).err().unwrap_or_default();
        assert!(err("[rule.rls]\ndomain = \"\"\n").contains("1: rule \"c\": `rls.domain`: must not be empty"));
        assert!(
            err("[rule.rls]\ndomain = \"d\"\nkey = [\"a\", \"a\"]\n").contains("`rls.key`: names the entry `a` twice")
        );
        assert!(err("[rule.rls]\ndomain = \"d\"\nkey = [\"\"]\n").contains("must not be empty"));
        assert!(err("[rule.rls]\ndomain = \"d\"\nkeys = [\"a\"]\n").contains("unknown field `keys`"));
        assert!(err("[rule.rls]\nkey = [\"a\"]\n").contains("missing field `domain`"));
    }

    #[test]
    fn the_first_route_in_file_order_answers() {
        let mut a = route(&[("generic_key", "checkout")], &["remote_address"]);
        a.rule = "a".into();
        let mut b = route(&[], &["remote_address"]);
        b.rule = "b".into();
        let routes = [a, b];
        let hit = rls_match(&routes, "shop", &[("generic_key", "checkout"), ("remote_address", "1")]);
        assert_eq!(hit.map(|(r, k)| (r.rule.as_str(), k)), Some(("a", "1".into())));
        let hit = rls_match(&routes, "shop", &[("remote_address", "2")]);
        assert_eq!(hit.map(|(r, k)| (r.rule.as_str(), k)), Some(("b", "2".into())));
    }
}
