//! `--cluster-selector`: which PostgresClusters this operator manages, as a Kubernetes
//! label selector (the `kubectl get -l` syntax). Two releases side by side, a canary and a
//! stable one, each manage their half of the clusters with complementary selectors, e.g.
//! `pgop.example.com/channel=canary` and `pgop.example.com/channel!=canary`
//! (docs/operator.md, "Upgrading pgop").
//!
//! The API server filters the operator's watch of PostgresClusters by the selector; the
//! backup controller, which watches every PostgresBackup, matches the selector against
//! each backup's cluster with [`SelectorExt::matches`].

use kube::core::{Expression, Selector, SelectorExt};
use pgop_api::formats::{is_label_key, is_label_value};
use std::collections::{BTreeMap, BTreeSet};

/// Parses a label selector: requirements separated by commas, each `key`, `!key`,
/// `key=value` (or `==`), `key!=value`, `key in (v1,v2)` or `key notin (v1,v2)`. Keys and
/// values are checked as Kubernetes checks label keys and values, so that nothing else
/// (quotes, newlines, `$( )`, `#`) reaches the API server's query string. The error names
/// the requirement and what is wrong with it.
pub fn parse(text: &str) -> Result<Selector, String> {
    if text.trim().is_empty() {
        return Err("an empty selector: leave the option out to manage every cluster".into());
    }
    let mut expressions = Vec::new();
    for part in split_top_level(text)? {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "{text:?}: an empty requirement (two commas, or a comma at an end)"
            ));
        }
        expressions.push(requirement(part)?);
    }
    Ok(expressions.into_iter().collect())
}

/// Whether a PostgresCluster with these labels is managed under `selector` (`None`: every
/// cluster).
pub fn manages(selector: Option<&Selector>, labels: &BTreeMap<String, String>) -> bool {
    selector.is_none_or(|s| s.matches(labels))
}

/// Splits at the commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("{text:?}: nested parentheses")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("{text:?}: a ')' without its '('")),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: a '(' without its ')'"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn key(requirement: &str, key: &str) -> Result<String, String> {
    let key = key.trim();
    if is_label_key(key) {
        Ok(key.to_string())
    } else {
        Err(format!(
            "{requirement:?}: {key:?} is not a label key (an optional DNS-subdomain prefix and \
             '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a \
             letter or digit)"
        ))
    }
}

fn value(requirement: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    if is_label_value(value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{requirement:?}: {value:?} is not a label value (at most 63 letters, digits, '-', \
             '_' or '.', starting and ending with a letter or digit, or empty)"
        ))
    }
}

fn requirement(part: &str) -> Result<Expression, String> {
    if let Some(rest) = part.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key(part, rest)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Expression::NotEqual(key(part, k)?, value(part, v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        let v = v.strip_prefix('=').unwrap_or(v);
        return Ok(Expression::Equal(key(part, k)?, value(part, v)?));
    }
    if let Some(open) = part.find('(') {
        let head = part[..open].trim_end();
        let (k, op) = head
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| format!("{part:?}: expected `key in (...)` or `key notin (...)`"))?;
        let inner = part[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{part:?}: text after the ')'"))?;
        let values = inner
            .split(',')
            .map(|v| value(part, v))
            .collect::<Result<BTreeSet<_>, _>>()?;
        if inner.trim().is_empty() {
            return Err(format!("{part:?}: an empty set of values"));
        }
        return match op {
            "in" => Ok(Expression::In(key(part, k)?, values)),
            "notin" => Ok(Expression::NotIn(key(part, k)?, values)),
            other => Err(format!(
                "{part:?}: unknown operator {other:?} (=, ==, !=, in, notin, or a key alone \
                 or with '!')"
            )),
        };
    }
    if part.contains(['<', '>']) {
        return Err(format!(
            "{part:?}: the < and > operators do not apply to labels here (=, ==, !=, in, notin)"
        ));
    }
    Ok(Expression::Exists(key(part, part)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_parses_and_prints_as_the_api_server_reads_it() {
        let cases = [
            (
                "pgop.example.com/channel=canary",
                "pgop.example.com/channel=canary",
            ),
            (" tier == gold ", "tier=gold"),
            (
                "pgop.example.com/channel!=canary",
                "pgop.example.com/channel!=canary",
            ),
            ("!pgop.example.com/canary", "!pgop.example.com/canary"),
            ("canary", "canary"),
            ("env in (prod, staging)", "env in (prod,staging)"),
            ("env notin (dev)", "env notin (dev)"),
            ("a=1,b in (x,y),!c", "a=1,b in (x,y),!c"),
            ("a=", "a="),
        ];
        for (text, printed) in cases {
            let s = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(s.to_string(), printed, "{text:?}");
            // What it prints parses to the same selector.
            assert_eq!(
                parse(printed).map(|p| p.to_string()),
                Ok(printed.to_string())
            );
        }
    }

    #[test]
    fn complementary_selectors_split_the_clusters_in_two() {
        let canary = parse("pgop.example.com/channel=canary").expect("canary");
        let stable = parse("pgop.example.com/channel!=canary").expect("stable");
        for l in [
            labels(&[]),
            labels(&[("pgop.example.com/channel", "canary")]),
            labels(&[("pgop.example.com/channel", "stable")]),
            labels(&[("team", "a")]),
        ] {
            assert_ne!(
                manages(Some(&canary), &l),
                manages(Some(&stable), &l),
                "exactly one release manages {l:?}"
            );
        }
        assert!(manages(None, &labels(&[])));
        let set = parse("env in (prod,staging),!legacy").expect("set");
        assert!(manages(Some(&set), &labels(&[("env", "prod")])));
        assert!(!manages(
            Some(&set),
            &labels(&[("env", "prod"), ("legacy", "")])
        ));
        assert!(!manages(Some(&set), &labels(&[("env", "dev")])));
        let notin = parse("env notin (dev)").expect("notin");
        assert!(manages(Some(&notin), &labels(&[])));
        assert!(!manages(Some(&notin), &labels(&[("env", "dev")])));
    }

    #[test]
    fn hostile_or_malformed_selectors_are_refused_naming_the_requirement() {
        let cases = [
            ("", "empty selector"),
            ("a=1,", "empty requirement"),
            ("a=1,,b", "empty requirement"),
            ("a=$(reboot)", "not a label value"),
            ("a='x'", "not a label value"),
            ("a=x\nb=y", "not a label value"),
            ("a b=x", "not a label key"),
            ("a#b", "not a label key"),
            ("../x=1", "not a label key"),
            ("a=x y", "not a label value"),
            ("env in (a,(b))", "nested parentheses"),
            ("env in (a", "without its ')'"),
            ("env in a)", "without its '('"),
            ("env in ()", "empty set"),
            ("env in (a) b", "text after"),
            ("env within (a)", "unknown operator"),
            ("(a)", "expected `key in"),
            ("replicas>2", "< and > operators"),
            ("!", "not a label key"),
        ];
        for (text, why) in cases {
            match parse(text) {
                Ok(s) => panic!("{text:?} parsed as {s}"),
                Err(e) => assert!(e.contains(why), "{text:?}: {e}"),
            }
        }
    }
}
