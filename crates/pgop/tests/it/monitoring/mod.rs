//! pgop's monitoring assets as published in `deploy/monitoring/`: the alert rules (the
//! PrometheusRule's `spec.groups`), the Grafana dashboard, and the metric names their
//! queries use. Shared by `monitoring_rules.rs` and `e2e_monitoring.rs`.
#![allow(dead_code)] // each test module (and each benchmark) uses its own subset

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `deploy/monitoring/<name>`.
pub fn deploy(name: &str) -> PathBuf {
    root().join("deploy/monitoring").join(name)
}

fn read(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("failed to read {}: {e}", path.display()).into())
}

/// The `spec.groups` of `deploy/monitoring/prometheusrule.yaml`.
pub fn rule_groups() -> Result<serde_yaml::Value> {
    let rule: serde_yaml::Value = serde_yaml::from_str(&read(&deploy("prometheusrule.yaml"))?)?;
    if rule["kind"].as_str() != Some("PrometheusRule") {
        return Err(format!("not a PrometheusRule: {:?}", rule["kind"]).into());
    }
    let groups = rule["spec"]["groups"].clone();
    if groups.as_sequence().is_none_or(Vec::is_empty) {
        return Err("the PrometheusRule has no spec.groups".into());
    }
    Ok(groups)
}

/// Every rule of the groups.
pub fn rules(groups: &serde_yaml::Value) -> Vec<&serde_yaml::Value> {
    groups
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .collect()
}

/// `deploy/monitoring/dashboard.json`.
pub fn dashboard() -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&read(&deploy("dashboard.json"))?)?)
}

/// Every PromQL query of the dashboard: each panel's targets' `expr`.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

/// The query of each of the dashboard's variables (`label_values(metric, label)`).
fn variable_queries(dashboard: &serde_json::Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["definition"].as_str().map(str::to_string))
        .collect()
}

/// The names in `query` that are pgop's metrics: identifiers beginning with `pgop_`,
/// outside quoted strings (label values).
pub fn pgop_names(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = query.chars().peekable();
    let mut previous: Option<char> = None;
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                // Skip the string, escapes included.
                while let Some(s) = chars.next() {
                    if s == '\\' {
                        chars.next();
                    } else if s == c {
                        break;
                    }
                }
                previous = Some(c);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let starts = previous.is_none_or(|p| !(p.is_ascii_alphanumeric() || p == '_'));
                let mut word = c.to_string();
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphanumeric() || n == '_' || n == ':' {
                        word.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                previous = word.chars().last();
                if starts && word.starts_with("pgop_") {
                    names.insert(word);
                }
            }
            c => previous = Some(c),
        }
    }
    names
}

/// Every pgop metric name the alert rules and the dashboard query, with where each is used.
pub fn used_metric_names() -> Result<BTreeMap<String, Vec<String>>> {
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let groups = rule_groups()?;
    for rule in rules(&groups) {
        let what = rule["alert"]
            .as_str()
            .or(rule["record"].as_str())
            .unwrap_or("a rule without a name");
        let expr = rule["expr"].as_str().ok_or(format!("{what} has no expr"))?;
        for name in pgop_names(expr) {
            used.entry(name).or_default().push(format!("alert {what}"));
        }
    }
    let dashboard = dashboard()?;
    for query in dashboard_queries(&dashboard)
        .into_iter()
        .chain(variable_queries(&dashboard))
    {
        for name in pgop_names(&query) {
            used.entry(name)
                .or_default()
                .push(format!("dashboard query {query}"));
        }
    }
    Ok(used)
}

/// The sample names of an exposition in the text format (a histogram's `_bucket`, `_sum`
/// and `_count`, a counter's `_total`, as PromQL names them).
pub fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
        .collect()
}
