//! `kubectl pgop logs`: the logs of every instance Pod of a cluster (the manager's JSON
//! lines and PostgreSQL's, which the manager forwards), read through the API server
//! (`pods/log`, with the container runtime's timestamps) and merged in time order.
//! `text` prints `TIME POD LEVEL MESSAGE key=value...`; `json` one object per line, the
//! line's own JSON under `record` (a line that is not JSON as `{"text": ...}`).

use super::Error;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::io::Write;

/// One log line of one Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The runtime's timestamp (RFC 3339, nanoseconds), as the API server gave it.
    pub time: String,
    pub pod: String,
    pub text: String,
}

/// Splits `pods/log` output read with `timestamps=true` into lines of `pod`.
pub fn parse(pod: &str, body: &str) -> Vec<Line> {
    body.lines()
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once(' ') {
            Some((time, text)) if time.parse::<jiff::Timestamp>().is_ok() => Line {
                time: time.to_string(),
                pod: pod.to_string(),
                text: text.to_string(),
            },
            _ => Line {
                time: String::new(),
                pod: pod.to_string(),
                text: l.to_string(),
            },
        })
        .collect()
}

/// Every Pod's lines in time order (a stable sort: each Pod's own order is kept for equal
/// or missing times).
pub fn merge(mut per_pod: Vec<Vec<Line>>) -> Vec<Line> {
    let mut all: Vec<Line> = per_pod.drain(..).flatten().collect();
    all.sort_by_key(|l| l.time.parse::<jiff::Timestamp>().ok());
    all
}

/// A line as one readable row: the manager's JSON (`level`, `fields.message` and the
/// other fields) and PostgreSQL's forwarded lines (`msg`) are unpacked; anything else is
/// printed as it is.
pub fn pretty(line: &Line) -> String {
    let time = line
        .time
        .parse::<jiff::Timestamp>()
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|_| line.time.clone());
    let (level, message) = match serde_json::from_str::<Value>(&line.text) {
        Ok(Value::Object(o)) => {
            if let Some(msg) = o.get("msg").and_then(Value::as_str) {
                ("PG".to_string(), msg.to_string())
            } else {
                let level = o.get("level").and_then(Value::as_str).unwrap_or("-");
                let mut message = String::new();
                if let Some(Value::Object(fields)) = o.get("fields") {
                    if let Some(m) = fields.get("message").and_then(Value::as_str) {
                        message.push_str(m);
                    }
                    for (k, v) in fields.iter().filter(|(k, _)| *k != "message") {
                        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                        message.push_str(&format!(" {k}={v}"));
                    }
                }
                (level.to_string(), message)
            }
        }
        _ => ("-".to_string(), line.text.clone()),
    };
    // One row per line: a multi-line message (PostgreSQL's DETAIL and HINT, an error
    // chain) keeps its line breaks as `\n`.
    let message = message.trim().replace('\n', "\\n");
    format!("{time} {} {level} {message}", line.pod)
}

/// A line as one JSON object: time, pod and the line's own record.
pub fn as_json(line: &Line) -> Value {
    let record = match serde_json::from_str::<Value>(&line.text) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"text": line.text}),
    };
    json!({"time": line.time, "pod": line.pod, "record": record})
}

/// Reads and prints the logs of `cluster`'s instance Pods (the last `tail` lines of each).
pub async fn print(
    client: &Client,
    ns: &str,
    cluster: &str,
    tail: Option<i64>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let listed = pods
        .list(&ListParams::default().labels(&pgop_api::labels::instance_selector(cluster)))
        .await?;
    if listed.items.is_empty() {
        return Err(format!(
            "cluster {cluster} has no instance Pods in namespace {ns} (hibernated, or not created yet)"
        )
        .into());
    }
    let params = LogParams {
        container: Some("postgres".to_string()),
        timestamps: true,
        tail_lines: tail,
        ..LogParams::default()
    };
    let mut per_pod = Vec::new();
    let mut failed = Vec::new();
    for pod in &listed.items {
        let name = pod.name_any();
        match pods.logs(&name, &params).await {
            Ok(body) => per_pod.push(parse(&name, &body)),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    if per_pod.is_empty() {
        return Err(format!(
            "the API server gave no log of the cluster's Pods (its nodes' kubelets serve them): {}",
            failed.join("; ")
        )
        .into());
    }
    for f in &failed {
        eprintln!("kubectl pgop: no log of {f}");
    }
    for line in merge(per_pod) {
        if json {
            writeln!(out, "{}", as_json(&line))?;
        } else {
            writeln!(out, "{}", pretty(&line))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_several_pods_merge_in_time_order_and_read_well() {
        let a = parse(
            "db-1",
            "2026-12-04T10:00:00.300000000Z {\"timestamp\":\"x\",\"level\":\"INFO\",\"fields\":{\"message\":\"holding the primary Lease\",\"lease\":\"db\"},\"target\":\"t\"}\n\
             2026-12-04T10:00:01.000000000Z {\"instance\":\"db-1\",\"logger\":\"postgres\",\"msg\":\"LOG:  checkpoint starting\"}\n",
        );
        let b = parse("db-2", "2026-12-04T10:00:00.500000000Z plain text\n");
        let multi = parse(
            "db-2",
            "2026-12-04T10:00:02Z {\"level\":\"WARN\",\"fields\":{\"message\":\"a\\nb\"}}",
        );
        assert_eq!(
            pretty(&multi[0]),
            "2026-12-04T10:00:02.000Z db-2 WARN a\\nb"
        );
        let merged = merge(vec![a, b]);
        let rows: Vec<String> = merged.iter().map(pretty).collect();
        assert_eq!(
            rows,
            [
                "2026-12-04T10:00:00.300Z db-1 INFO holding the primary Lease lease=db",
                "2026-12-04T10:00:00.500Z db-2 - plain text",
                "2026-12-04T10:00:01.000Z db-1 PG LOG:  checkpoint starting",
            ]
        );
        let j = as_json(&merged[1]);
        assert_eq!(j["pod"], "db-2");
        assert_eq!(j["record"]["text"], "plain text");
        assert_eq!(as_json(&merged[0])["record"]["fields"]["lease"], "db");
    }
}
