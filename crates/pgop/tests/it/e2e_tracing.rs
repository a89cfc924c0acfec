//! OpenTelemetry traces end to end: `pgop operator` (a process, JSON logs) and its
//! instance managers (local node) export OTLP/HTTP to a receiver in this test, which
//! decodes what arrives. A reconcile is a trace with its steps as children; a switchover's
//! fresh probes carry the trace to the managers, whose `GET /pg/status` spans join it,
//! and the target's promotion is a span of the pass that chose it (through
//! `status.targetPrimaryTrace`); the operator's log lines of a reconcile name its trace.
//! Every body received is also decoded by the OpenTelemetry collector's own OTLP/JSON
//! decoder (hack/otlp-check), which must take it whole.

use crate::common;

use common::*;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One exported span: the service that sent it, and the span as OTLP/JSON has it.
#[derive(Clone, Debug)]
struct Exported {
    service: String,
    span: Value,
}

/// Every request body received, as sent.
type Bodies = Arc<Mutex<Vec<axum::body::Bytes>>>;

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces` with a JSON body, as the
/// OpenTelemetry collector's `otlp` receiver takes it; it keeps the bodies too, for
/// [`collector_decodes`].
async fn receiver() -> Result<(String, Arc<Mutex<Vec<Exported>>>, Bodies)> {
    use axum::routing::post;
    let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let bodies: Bodies = Arc::default();
    let sink = spans.clone();
    let raw = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            if let Ok(mut all) = raw.lock() {
                all.push(body.clone());
            }
            async move {
                let json = headers
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes() == b"application/json");
                let Ok(body) = serde_json::from_slice::<Value>(&body) else {
                    return (http::StatusCode::BAD_REQUEST, "not JSON");
                };
                if !json {
                    return (http::StatusCode::UNSUPPORTED_MEDIA_TYPE, "not JSON");
                }
                let mut got = Vec::new();
                for resource in body["resourceSpans"].as_array().into_iter().flatten() {
                    let service = resource["resource"]["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["key"] == "service.name")
                        .and_then(|a| a["value"]["stringValue"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                        for span in scope["spans"].as_array().into_iter().flatten() {
                            got.push(Exported {
                                service: service.clone(),
                                span: span.clone(),
                            });
                        }
                    }
                }
                if let Ok(mut all) = sink.lock() {
                    all.extend(got);
                }
                (http::StatusCode::OK, "{}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), spans, bodies))
}

/// Passes every body through the OpenTelemetry collector's own OTLP/JSON decoder
/// (hack/otlp-check, built by hack/install-otlp-check.sh); the spans it counts.
fn collector_decodes(bodies: &Bodies) -> Result<u64> {
    let check = match std::env::var_os("PGOP_OTLP_CHECK") {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/pgop/otlp-check/bin/otlp-check"),
    };
    if !check.is_file() {
        return Err(format!(
            "otlp-check not found at {}: build it with `hack/install-otlp-check.sh` (or set PGOP_OTLP_CHECK)",
            check.display()
        )
        .into());
    }
    let all = bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let mut spans = 0;
    for body in &all {
        let mut child = Command::new(&check)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().ok_or("no stdin")?;
            stdin.write_all(body)?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!(
                "the collector's decoder refused a body: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(body)
            )
            .into());
        }
        let summary: Value = serde_json::from_slice(&out.stdout)?;
        spans += summary["spans"].as_u64().ok_or("no span count")?;
    }
    Ok(spans)
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn snapshot(spans: &Mutex<Vec<Exported>>) -> Vec<Exported> {
    spans.lock().map(|s| s.clone()).unwrap_or_default()
}

/// Waits until `found` picks something out of the spans received so far.
async fn wait_spans<T>(
    spans: &Mutex<Vec<Exported>>,
    what: &str,
    found: impl Fn(&[Exported]) -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let all = snapshot(spans);
        if let Some(t) = found(&all) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            let names: Vec<String> = all
                .iter()
                .map(|e| format!("{} {}", e.service, e.span["name"]))
                .collect();
            return Err(format!("no {what} within {TIMEOUT:?}; received: {names:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The root of `span`'s chain of parents among `all`.
fn all_roots(all: &[Exported], span: &Value) -> Value {
    let mut at = span.clone();
    for _ in 0..16 {
        match all
            .iter()
            .find(|e| e.span["spanId"] == at["parentSpanId"] && e.span["traceId"] == at["traceId"])
        {
            Some(parent) => at = parent.span.clone(),
            None => break,
        }
    }
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_switchover_is_one_trace_from_the_operator_to_the_managers() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start_without_operator("tracing").await?;
    let (endpoint, spans, bodies) = receiver().await?;
    let settings = env.operator_options().settings;
    let mut operator = Command::new(env!("CARGO_BIN_EXE_pgop"))
        .args(["operator", "--log-format", "json", "--leader-elect=false"])
        .args(["--metrics-bind-address", "0", "--namespace", env.n()])
        .arg(format!("--instance-uid={}", settings.run_as_user))
        .arg(format!("--instance-gid={}", settings.run_as_group))
        .arg(format!("--instance-otlp-endpoint={endpoint}"))
        .env("KUBECONFIG", env.plane.kubeconfig())
        .env("RUST_LOG", "info")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = operator.stderr.take().ok_or("no stderr")?;
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr)
            .lines()
            .map_while(std::io::Result::ok)
        {
            if let Ok(mut all) = kept.lock() {
                all.push(line);
            }
        }
    });
    let result = async {
        env.create("tr", json!({"replicas": 2, "storage": {"size": "1Gi"}}))
            .await?;
        env.wait_ready("tr", 2).await?;

        // A reconcile: a root span naming the cluster, its steps children in its trace.
        let (trace, root) = wait_spans(&spans, "a reconcile with its steps", |all| {
            all.iter()
                .filter(|e| e.service == "pgop-operator" && e.span["name"] == "reconcile")
                .filter(|e| attribute(&e.span, "cluster") == Some(&json!({"stringValue": "tr"})))
                .find_map(|root| {
                    let children: Vec<&str> = all
                        .iter()
                        .filter(|c| c.span["parentSpanId"] == root.span["spanId"])
                        .filter_map(|c| c.span["name"].as_str())
                        .collect();
                    ["read", "plan", "probe", "credentials", "status", "apply"]
                        .iter()
                        .all(|step| children.contains(step))
                        .then(|| (root.span["traceId"].clone(), root.span.clone()))
                })
        })
        .await?;
        assert!(root.get("parentSpanId").is_none(), "{root}");
        assert_eq!(root["kind"], 1, "{root}");
        assert_eq!(
            attribute(&root, "namespace"),
            Some(&json!({"stringValue": env.n()}))
        );
        let ids = |all: &[Exported]| -> Vec<Value> {
            all.iter()
                .filter(|e| e.span["traceId"] == trace)
                .map(|e| e.span["spanId"].clone())
                .collect()
        };
        let in_trace = ids(&snapshot(&spans));
        assert!(in_trace.len() >= 7, "{in_trace:?}");

        // The operator's log lines of that pass name its trace.
        let trace_hex = trace.as_str().ok_or("a trace id")?.to_string();
        let logged = lines.lock().map(|l| l.clone()).unwrap_or_default();
        let named: Vec<Value> = logged
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["span"]["trace_id"] == trace_hex.as_str())
            .collect();
        // A pass that logged nothing is possible; some pass of this cluster did log.
        let any_named = logged
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["span"]["name"] == "reconcile" && v["span"]["cluster"] == "tr")
            .collect::<Vec<_>>();
        assert!(!any_named.is_empty(), "no reconcile line in {logged:#?}");
        for line in &any_named {
            let id = line["span"]["trace_id"].as_str().unwrap_or_default();
            assert_eq!(
                id.len(),
                32,
                "a reconcile line without its trace id: {line}"
            );
        }
        for line in &named {
            assert_eq!(line["span"]["cluster"], "tr", "{line}");
        }

        // A switchover: the passes that carry it probe the instances afresh, and each
        // manager's answer is a span of the operator's trace, the child of its probe.
        let primary = env.current_primary("tr").await?;
        let target = if primary == "tr-1" { "tr-2" } else { "tr-1" };
        env.patch(
            "tr",
            json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: target}}}),
        )
        .await?;
        env.wait_cluster("tr", "the switchover done", TIMEOUT, |s| {
            s.current_primary.as_deref() == Some(target)
                && s.target_primary.as_deref() == Some(target)
        })
        .await?;
        let (probe, served) = wait_spans(&spans, "a manager's span in an operator trace", |all| {
            all.iter()
                .filter(|e| e.service == "pgop-instance" && e.span["name"] == "GET /pg/status")
                .find_map(|served| {
                    let probe = all.iter().find(|p| {
                        p.service == "pgop-operator"
                            && p.span["spanId"] == served.span["parentSpanId"]
                    })?;
                    Some((probe.span.clone(), served.span.clone()))
                })
        })
        .await?;
        // A fresh probe of one instance, or the first probe of a newly tracked one made
        // within the reconcile's probe step.
        assert!(
            probe["name"] == "probe instance" || probe["name"] == "probe",
            "{probe}"
        );
        assert_eq!(served["traceId"], probe["traceId"]);
        assert_eq!(served["kind"], 2, "a server span: {served}");
        assert_eq!(
            attribute(&served, "http.response.status_code"),
            Some(&json!({"intValue": "200"}))
        );
        // The probe sits in a reconcile's trace: its chain of parents ends at a reconcile.
        let at = all_roots(&snapshot(&spans), &probe);
        assert_eq!(at["name"], "reconcile", "the probe's root: {at}");
        assert!(at.get("parentSpanId").is_none(), "{at}");

        // From decision to promotion: the pass that named the target wrote its trace in
        // the status, and the target's promotion is a span of it, under that pass's
        // status step.
        let written = env
            .clusters_v1beta1()
            .get("tr")
            .await?
            .status
            .and_then(|s| s.target_primary_trace)
            .ok_or("no status.targetPrimaryTrace")?;
        let (decided, promoted) =
            wait_spans(&spans, "the promotion in the decision's trace", |all| {
                all.iter()
                    .filter(|e| e.service == "pgop-instance" && e.span["name"] == "promote")
                    .find_map(|promoted| {
                        let decided = all.iter().find(|d| {
                            d.service == "pgop-operator"
                                && d.span["spanId"] == promoted.span["parentSpanId"]
                                && d.span["traceId"] == promoted.span["traceId"]
                        })?;
                        Some((decided.span.clone(), promoted.span.clone()))
                    })
            })
            .await?;
        assert_eq!(decided["name"], "status", "{decided}");
        assert_eq!(
            written,
            format!(
                "00-{}-{}-01",
                decided["traceId"].as_str().unwrap_or_default(),
                decided["spanId"].as_str().unwrap_or_default()
            )
        );
        let root = all_roots(&snapshot(&spans), &decided);
        assert_eq!(root["name"], "reconcile", "{root}");
        assert!(
            promoted["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("promoting")))),
            "{promoted}"
        );
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    let _ = operator.kill();
    let _ = operator.wait();
    result?;
    // What the collector itself would make of it: every body decodes, to the same spans.
    let received = snapshot(&spans).len() as u64;
    let decoded = collector_decodes(&bodies)?;
    assert_eq!(
        decoded, received,
        "spans decoded by the collector's decoder and by this test"
    );
    assert!(received > 0);
    env.stop().await
}
