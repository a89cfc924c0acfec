//! pgop's alert rules and dashboard (`deploy/monitoring/`), checked with promtool
//! (`hack/install-promtool.sh` builds it): the PrometheusRule's groups pass `promtool check
//! rules`, the unit tests of `deploy/monitoring/tests/` pass `promtool test rules` and
//! cover every alert firing and not firing, every alert carries a severity, a summary, a
//! description and its runbook's section of `docs/runbooks.md`, and every query of the
//! dashboard parses. That the metrics they name are pgop's is `e2e_monitoring.rs`'s test.

use crate::monitoring;

use monitoring::*;
use pgop_testenv::TempDir;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to install promtool.
const INSTALL_COMMAND: &str = "hack/install-promtool.sh";

/// promtool: `PGOP_PROMTOOL`, else where `hack/install-promtool.sh` puts it; an error
/// naming that script when it is not there.
fn promtool() -> Result<PathBuf> {
    find_promtool(
        std::env::var_os("PGOP_PROMTOOL"),
        &pgop_testenv::binaries::cache_dir(),
    )
}

/// [`promtool`], given `PGOP_PROMTOOL` and the cache directory.
fn find_promtool(env: Option<std::ffi::OsString>, cache: &Path) -> Result<PathBuf> {
    let path = match env {
        Some(path) => PathBuf::from(path),
        None => cache.join("promtool/bin/promtool"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "promtool not found at {}: install it with `{INSTALL_COMMAND}` (or set PGOP_PROMTOOL)",
            path.display()
        )
        .into())
    }
}

/// Runs promtool with `args` in `dir`; its output, or an error with it.
fn run_promtool(dir: &Path, args: &[&str]) -> Result<String> {
    let promtool = promtool()?;
    let out = Command::new(&promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("failed to run {}: {e}", promtool.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "promtool {} failed ({}):\n{text}",
            args.join(" "),
            out.status
        )
        .into())
    }
}

/// `groups` written as a plain rules file (what promtool reads) in `dir`.
fn rules_file(dir: &Path, groups: &serde_yaml::Value) -> Result<PathBuf> {
    let mut file = serde_yaml::Mapping::new();
    file.insert("groups".into(), groups.clone());
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file)?)?;
    Ok(path)
}

fn alert_names(groups: &serde_yaml::Value) -> Vec<String> {
    rules(groups)
        .into_iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_prometheusrule_passes_promtool_check_rules() -> Result {
    let groups = rule_groups()?;
    let dir = TempDir::new("monitoring-check")?;
    rules_file(&dir.0, &groups)?;
    let out = run_promtool(&dir.0, &["check", "rules", "rules.yaml"])?;
    let n = rules(&groups).len();
    assert!(n >= 12, "{n} rules");
    assert!(
        out.contains(&format!("SUCCESS: {n} rules found")),
        "promtool check rules:\n{out}"
    );
    // Only alerts, each in one group only once.
    let names = alert_names(&groups);
    assert_eq!(names.len(), n, "every rule is an alert");
    assert_eq!(
        names.iter().collect::<BTreeSet<_>>().len(),
        n,
        "alert names repeat: {names:?}"
    );
    Ok(())
}

/// The unit tests load the chart's `monitoring/rules.yaml` (a plain rules file, the one
/// source); the published PrometheusRule holds the same groups.
#[test]
fn the_unit_tests_pass_and_cover_every_alert_firing_and_not() -> Result {
    let chart_rules: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        root().join("charts/pgop/monitoring/rules.yaml"),
    )?)?;
    let groups = rule_groups()?;
    assert_eq!(
        chart_rules["groups"], groups,
        "deploy/monitoring/prometheusrule.yaml holds other rules than charts/pgop/monitoring/rules.yaml; run hack/render-deploy.sh"
    );

    let dir = deploy("tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    files.retain(|f| f.ends_with(".yaml"));
    files.sort();
    assert!(!files.is_empty(), "no unit tests in {}", dir.display());
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let out = run_promtool(&dir, &args)?;
    assert_eq!(
        out.matches("SUCCESS").count(),
        files.len(),
        "promtool test rules:\n{out}"
    );

    // Every alert is expected to fire somewhere, and expected silent somewhere.
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for file in &files {
        let tests: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join(file))?)?;
        assert_eq!(
            tests["rule_files"],
            serde_yaml::from_str::<serde_yaml::Value>(
                "[../../../charts/pgop/monitoring/rules.yaml]"
            )?,
            "{file} tests another rules file"
        );
        for test in tests["tests"].as_sequence().into_iter().flatten() {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap_or_default().to_string();
                match case["exp_alerts"].as_sequence().map(Vec::len) {
                    Some(0) | None => silent.insert(name),
                    Some(_) => fires.insert(name),
                };
            }
        }
    }
    for alert in alert_names(&groups) {
        assert!(fires.contains(&alert), "no unit test where {alert} fires");
        assert!(
            silent.contains(&alert),
            "no unit test where {alert} stays silent"
        );
    }
    Ok(())
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to dashes, punctuation gone.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_its_runbook() -> Result {
    let groups = rule_groups()?;
    let runbooks = std::fs::read_to_string(root().join("docs/runbooks.md"))?;
    let sections: Vec<&str> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    let alerts = alert_names(&groups);
    for rule in rules(&groups) {
        let alert = rule["alert"].as_str().unwrap_or_default();
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{alert}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| s.len() > 20),
                "{alert}: no {key}"
            );
        }
        let url = rule["annotations"]["runbook_url"].as_str();
        let section = format!("docs/runbooks.md#{}", anchor(alert));
        assert_eq!(url, Some(section.as_str()), "{alert}: runbook_url");
        assert!(
            sections.iter().any(|s| anchor(s) == anchor(alert)),
            "docs/runbooks.md has no section `## {alert}`"
        );
        for part in [
            "**Meaning.**",
            "**Impact.**",
            "**Diagnosis.**",
            "**Mitigation.**",
        ] {
            let body = runbooks
                .split(&format!("## {alert}\n"))
                .nth(1)
                .and_then(|rest| rest.split("\n## ").next())
                .unwrap_or_default();
            assert!(body.contains(part), "the runbook of {alert} lacks {part}");
        }
    }
    // And no section for an alert that does not exist.
    for section in sections.iter().filter(|s| s.starts_with("Pgop")) {
        assert!(
            alerts.iter().any(|a| a == section),
            "docs/runbooks.md has a section for {section}, which is no alert"
        );
    }
    Ok(())
}

#[test]
fn every_query_of_the_dashboard_parses() -> Result {
    let dashboard = dashboard()?;
    let chart = std::fs::read_to_string(root().join("charts/pgop/monitoring/dashboard.json"))?;
    assert_eq!(
        std::fs::read_to_string(deploy("dashboard.json"))?,
        chart,
        "deploy/monitoring/dashboard.json is not charts/pgop/monitoring/dashboard.json; run hack/render-deploy.sh"
    );
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());
    // promtool parses PromQL in rules: each query as a recording rule.
    let records: Vec<serde_yaml::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let mut rule = serde_yaml::Mapping::new();
            rule.insert("record".into(), format!("pgop:dashboard_query_{i}").into());
            rule.insert("expr".into(), q.clone().into());
            serde_yaml::Value::Mapping(rule)
        })
        .collect();
    let mut group = serde_yaml::Mapping::new();
    group.insert("name".into(), "dashboard".into());
    group.insert("rules".into(), records.into());
    let groups = serde_yaml::Value::Sequence(vec![group.into()]);
    let dir = TempDir::new("monitoring-dashboard")?;
    rules_file(&dir.0, &groups)?;
    let out = run_promtool(&dir.0, &["check", "rules", "rules.yaml"])?;
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{out}"
    );
    // Every panel has an id of its own, a title and a place.
    let panels = dashboard["panels"].as_array().ok_or("no panels")?;
    let ids: BTreeSet<i64> = panels.iter().filter_map(|p| p["id"].as_i64()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids repeat or are missing");
    for p in panels {
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{p}");
        assert!(p["gridPos"]["w"].as_i64().is_some_and(|w| w > 0), "{p}");
    }
    Ok(())
}

#[test]
fn promtool_missing_is_an_error_naming_its_installer() -> Result {
    let empty = TempDir::new("monitoring-no-promtool")?;
    let err = find_promtool(None, &empty.0).expect_err("no promtool in an empty cache");
    let message = err.to_string();
    assert!(
        message.contains("hack/install-promtool.sh")
            && message.contains(&empty.0.join("promtool/bin/promtool").display().to_string()),
        "{message}"
    );
    let err = find_promtool(Some("/nonexistent/promtool".into()), &empty.0)
        .expect_err("PGOP_PROMTOOL naming nothing");
    assert!(err.to_string().contains("/nonexistent/promtool"), "{err}");
    // Found where the installer puts it, and where PGOP_PROMTOOL says.
    let bin = empty.0.join("promtool/bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::write(bin.join("promtool"), "")?;
    assert_eq!(find_promtool(None, &empty.0)?, bin.join("promtool"));
    assert_eq!(
        find_promtool(Some(bin.join("promtool").into()), Path::new("/nonexistent"))?,
        bin.join("promtool")
    );
    Ok(())
}

#[test]
fn pgop_names_are_found_outside_strings_only() {
    let names = pgop_names(
        r#"max by (namespace) (rate(pgop_a_total{x="pgop_not_a_name", y=~'pgop_nor'}[5m])) / pgop_b_bytes and on(namespace) xpgop_c unless pgop_d:rec"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["pgop_a_total", "pgop_b_bytes", "pgop_d:rec"]
    );
    assert_eq!(
        sample_names("# TYPE pgop_x histogram\npgop_x_bucket{le=\"1\"} 1\npgop_up 1\n# EOF\n")
            .into_iter()
            .collect::<Vec<_>>(),
        ["pgop_up", "pgop_x_bucket"]
    );
}
