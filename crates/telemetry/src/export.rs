//! OTLP/HTTP export with the JSON encoding (OpenTelemetry protocol 1.x, `application/json`
//! on `/v1/traces`), configured by the OpenTelemetry SDK's environment variables.

use crate::layer::{FinishedSpan, Sink, Value};
use serde_json::{Value as Json, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// The exporter's settings, read from the environment by [`Config::from_env`].
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The full URL spans are posted to.
    pub endpoint: String,
    pub headers: Vec<(String, String)>,
    /// Resource attributes: `service.name`, `service.version`, `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource: Vec<(String, String)>,
    /// How long finished spans wait for company before they are sent.
    pub delay: Duration,
    pub batch: usize,
    pub queue: usize,
    pub timeout: Duration,
}

fn millis(name: &str, value: Option<String>, default: u64) -> Result<Duration, String> {
    match value {
        None => Ok(Duration::from_millis(default)),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{name}={v:?}: not a number of milliseconds")),
    }
}

fn count(name: &str, value: Option<String>, default: usize) -> Result<usize, String> {
    match value {
        None => Ok(default),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{name}={v:?}: not a positive number")),
        },
    }
}

/// `key=value,key=value`, as OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS
/// write them (values percent-encoded).
fn pairs(name: &str, value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("{name}: {item:?} is not key=value"));
        };
        let (k, v) = (k.trim(), percent_decode(v.trim()));
        if k.is_empty() {
            return Err(format!("{name}: {item:?} has an empty key"));
        }
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `value` can be an OTLP/HTTP endpoint: an `http://` or `https://` URL with a
/// host. The error says why not (the caller names the variable or flag).
pub fn check_endpoint(value: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(value).map_err(|e| format!("{value:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{value:?} is not an http:// or https:// URL"));
    }
    Ok(())
}

impl Config {
    /// `None` when no endpoint is set (or `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`): then nothing is exported and spans cost only their
    /// ids. An error names the variable that is wrong.
    pub fn from_env(service: &str, version: &str) -> Result<Option<Config>, String> {
        Config::from_vars(service, version, |name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] over any source of variables (tests pass their own).
    pub fn from_vars(
        service: &str,
        version: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Config>, String> {
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") | Some("") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other:?}: pgop exports traces over OTLP only (otlp, or none)"
                ));
            }
        }
        let endpoint = match (
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|v| !v.trim().is_empty()),
            var("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.trim().is_empty()),
        ) {
            (Some(url), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.trim().to_string()),
            (None, Some(base)) => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("{}/v1/traces", base.trim().trim_end_matches('/')),
            ),
            (None, None) => return Ok(None),
        };
        check_endpoint(&endpoint.1).map_err(|e| format!("{}: {e}", endpoint.0))?;
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name).filter(|v| !v.trim().is_empty()) {
                if protocol.trim() != "http/json" {
                    return Err(format!(
                        "{name}={protocol:?}: pgop exports OTLP over HTTP with the JSON encoding \
                         only (http/json); point the endpoint at the collector's OTLP/HTTP \
                         port (4318 by default), which takes JSON as well as protobuf"
                    ));
                }
                break;
            }
        }
        let mut headers = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(value) = var(name) {
                for (k, v) in pairs(name, &value)? {
                    http::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("{name}: {k:?} is not a header name"))?;
                    http::HeaderValue::from_str(&v)
                        .map_err(|_| format!("{name}: the value of {k:?} is not a header value"))?;
                    headers.retain(|(old, _): &(String, String)| !old.eq_ignore_ascii_case(&k));
                    headers.push((k, v));
                }
            }
        }
        let mut resource = vec![
            (
                "service.name".to_string(),
                var("OTEL_SERVICE_NAME")
                    .filter(|v| !v.trim().is_empty())
                    .unwrap_or_else(|| service.to_string()),
            ),
            ("service.version".to_string(), version.to_string()),
        ];
        if let Some(value) = var("OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in pairs("OTEL_RESOURCE_ATTRIBUTES", &value)? {
                // OTEL_SERVICE_NAME wins over service.name here (the specification's order).
                if k == "service.name" && var("OTEL_SERVICE_NAME").is_some() {
                    continue;
                }
                resource.retain(|(old, _)| *old != k);
                resource.push((k, v));
            }
        }
        Ok(Some(Config {
            endpoint: endpoint.1,
            headers,
            resource,
            delay: millis(
                "OTEL_BSP_SCHEDULE_DELAY",
                var("OTEL_BSP_SCHEDULE_DELAY"),
                5000,
            )?,
            batch: count(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
                512,
            )?,
            queue: count(
                "OTEL_BSP_MAX_QUEUE_SIZE",
                var("OTEL_BSP_MAX_QUEUE_SIZE"),
                2048,
            )?,
            timeout: millis(
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                var("OTEL_EXPORTER_OTLP_TIMEOUT"),
                10_000,
            )?,
        }))
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
        .to_string()
}

fn value(v: &Value) -> Json {
    match v {
        Value::String(s) => json!({"stringValue": s}),
        // int64 is a string in OTLP/JSON.
        Value::Int(i) => json!({"intValue": i.to_string()}),
        Value::Bool(b) => json!({"boolValue": b}),
        Value::Double(d) if d.is_finite() => json!({"doubleValue": d}),
        Value::Double(d) => json!({"stringValue": d.to_string()}),
    }
}

fn attributes(list: &[(String, Value)]) -> Json {
    Json::Array(
        list.iter()
            .map(|(k, v)| json!({"key": k, "value": value(v)}))
            .collect(),
    )
}

/// One export request's body: the spans under the resource and pgop's scope.
pub fn encode(resource: &[(String, String)], spans: &[FinishedSpan]) -> Json {
    let resource: Vec<(String, Value)> = resource
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let spans: Vec<Json> = spans
        .iter()
        .map(|s| {
            let mut span = json!({
                "traceId": s.context.trace_id.to_string(),
                "spanId": s.context.span_id.to_string(),
                "name": s.name,
                "kind": s.kind as i32,
                "startTimeUnixNano": nanos(s.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": attributes(&s.attributes),
                "events": s.events.iter().map(|e| json!({
                    "timeUnixNano": nanos(e.time),
                    "name": e.name,
                    "attributes": attributes(&e.attributes),
                })).collect::<Vec<_>>(),
                "status": match &s.error {
                    Some(message) => json!({"code": 2, "message": message}),
                    None => json!({"code": 0}),
                },
            });
            if let Some(parent) = s.parent {
                span["parentSpanId"] = Json::String(parent.to_string());
            }
            span
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": attributes(&resource)},
        "scopeSpans": [{
            "scope": {"name": "pgop", "version": env!("CARGO_PKG_VERSION")},
            "spans": spans,
        }],
    }]})
}

/// The running exporter: [`Exporter::shutdown`] sends what is queued and stops it.
pub struct Exporter {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    dropped: Arc<AtomicU64>,
}

impl Exporter {
    /// Starts the export task (on the current Tokio runtime) and returns the layer's sink.
    pub(crate) fn start(config: Config) -> Result<(Exporter, Sink), String> {
        // https endpoints: rustls with ring, the provider the rest of pgop uses (installing
        // it twice is harmless).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| format!("OTLP exporter: {e}"))?;
        let (sender, receiver) = mpsc::channel(config.queue);
        let (stop, stopped) = oneshot::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(config, client, receiver, stopped, dropped.clone()));
        Ok((
            Exporter {
                stop: Some(stop),
                task,
                dropped: dropped.clone(),
            },
            Sink { sender, dropped },
        ))
    }

    /// Spans dropped so far (a full queue, or a failed export).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends the spans finished so far, then stops; gives up after `within`. Returns how
    /// many spans were dropped in all.
    pub async fn shutdown(mut self, within: Duration) -> u64 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(within, &mut self.task).await;
        self.dropped()
    }
}

async fn run(
    config: Config,
    client: reqwest::Client,
    mut receiver: mpsc::Receiver<FinishedSpan>,
    mut stopped: oneshot::Receiver<()>,
    dropped: Arc<AtomicU64>,
) {
    let mut batch: Vec<FinishedSpan> = Vec::new();
    let mut due = tokio::time::Instant::now() + config.delay;
    let mut failures = 0u64;
    loop {
        let stop = tokio::select! {
            span = receiver.recv() => match span {
                Some(span) => {
                    if batch.is_empty() {
                        due = tokio::time::Instant::now() + config.delay;
                    }
                    batch.push(span);
                    if batch.len() < config.batch {
                        continue;
                    }
                    false
                }
                None => true,
            },
            _ = tokio::time::sleep_until(due), if !batch.is_empty() => false,
            _ = &mut stopped => true,
        };
        if stop {
            while let Ok(span) = receiver.try_recv() {
                batch.push(span);
            }
        }
        for chunk in batch.chunks(config.batch) {
            if let Err(e) = send(&config, &client, chunk).await {
                dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                failures += 1;
                // The first failure, then one in a hundred: an unreachable collector must
                // not fill the log.
                if failures == 1 || failures.is_multiple_of(100) {
                    tracing::warn!(
                        endpoint = %config.endpoint,
                        error = %e,
                        failures,
                        "OTLP export failed; spans dropped"
                    );
                }
            }
        }
        batch.clear();
        if stop {
            return;
        }
    }
}

async fn send(
    config: &Config,
    client: &reqwest::Client,
    spans: &[FinishedSpan],
) -> Result<(), String> {
    let body = serde_json::to_vec(&encode(&config.resource, spans)).map_err(|e| e.to_string())?;
    let mut request = client
        .post(&config.endpoint)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body);
    for (k, v) in &config.headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("the collector answered {}", response.status()))
    }
}
