//! Probe: each instance's `/pg/status`, read over HTTP from its Pod IP, all instances in
//! parallel, each bounded by a short timeout so one hung instance cannot stall a
//! reconcile (and with it a failover).
//!
//! The instance manager is pgop's own server and answers one small JSON document, so a
//! minimal HTTP/1.1 client (`Connection: close`, `Content-Length` or chunked body) is all
//! this needs; it keeps an HTTP client stack out of the operator.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use pgop_api::constants::{MANAGER_PORT, PATH_PG_STATUS};
use pgop_api::instance_status::PgStatus;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use crate::cluster::world::Probe;

/// How long one instance may take to answer, connection included.
pub const TIMEOUT: Duration = Duration::from_millis(1500);
/// Largest response accepted (a status is a few KiB).
const MAX_RESPONSE: u64 = 1 << 20;

/// The status of every Pod, keyed by Pod name, probed in parallel on the manager port.
pub async fn probe_all(pods: &[Pod]) -> BTreeMap<String, Probe> {
    probe_all_on(pods, MANAGER_PORT).await
}

async fn probe_all_on(pods: &[Pod], port: u16) -> BTreeMap<String, Probe> {
    let probes = pods.iter().map(|pod| async move {
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        let probe = match ip {
            None => Probe::Unreachable("the pod has no IP yet".to_string()),
            Some(ip) => match tokio::time::timeout(TIMEOUT, get_status(&ip, port)).await {
                Ok(Ok(status)) => Probe::Status(Box::new(status)),
                Ok(Err(e)) => Probe::Unreachable(e),
                Err(_) => Probe::Unreachable(format!("no answer within {TIMEOUT:?}")),
            },
        };
        (pod.name_any(), probe)
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .collect()
}

async fn get_status(ip: &str, port: u16) -> Result<PgStatus, String> {
    let host = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    let body = get(&host, PATH_PG_STATUS).await?;
    serde_json::from_slice(&body).map_err(|e| format!("unreadable status from {host}: {e}"))
}

/// `GET path` on `host` (`ip:port`); the body of a 200 answer.
pub async fn get(host: &str, path: &str) -> Result<Vec<u8>, String> {
    match request(host, "GET", path, None).await? {
        (200, body) => Ok(body),
        (code, body) => Err(format!(
            "bad answer from {host}: status {code}: {}",
            String::from_utf8_lossy(&body).trim()
        )),
    }
}

/// One HTTP/1.1 request with an optional JSON body; the status code and body.
pub async fn request(
    host: &str,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), String> {
    let stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("failed to connect to {host}: {e}"))?;
    exchange(stream, host, method, path, json).await
}

/// How long a request over TLS may take, handshake included.
pub const TLS_TIMEOUT: Duration = Duration::from_secs(30);

/// [`request`] over mutual TLS to a manager's authenticated port (`host` is `ip:port`),
/// presenting the operator's certificate of `config` and verifying the manager's
/// (`pgop_tls`).
pub async fn request_tls(
    config: &std::sync::Arc<rustls::ClientConfig>,
    host: &str,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), String> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| format!("failed to connect to {host}: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(config.clone())
            .connect(pgop_tls::manager_server_name(), tcp)
            .await
            .map_err(|e| format!("TLS handshake with {host} failed: {e}"))?;
        exchange(stream, host, method, path, json).await
    };
    tokio::time::timeout(TLS_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer from {host} within {TLS_TIMEOUT:?}"))?
}

/// One request as a client span of the current trace (pgop_telemetry); its context goes
/// to the manager as `traceparent`.
async fn exchange<S>(
    stream: S,
    host: &str,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tracing::Instrument;
    let span = tracing::info_span!(
        target: pgop_telemetry::TRACE_ONLY,
        "http request",
        otel.kind = "client",
        otel.name = %format!("{method} {path}"),
        server.address = %host,
        http.response.status_code = tracing::field::Empty,
        error = tracing::field::Empty,
    );
    let result = exchange_in_span(stream, host, method, path, json)
        .instrument(span.clone())
        .await;
    match &result {
        Ok((code, _)) => {
            span.record("http.response.status_code", code);
        }
        Err(e) => {
            span.record("error", e.as_str());
        }
    }
    result
}

async fn exchange_in_span<S>(
    mut stream: S,
    host: &str,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let body = json.unwrap_or_default();
    let content = if json.is_some() {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    } else {
        String::new()
    };
    // Our own hex ids, never a value that came from elsewhere.
    let trace = pgop_telemetry::current_traceparent()
        .map(|t| format!("{}: {t}\r\n", pgop_telemetry::TRACEPARENT))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n{trace}{content}Connection: close\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("failed to send to {host}: {e}"))?;
    stream
        .write_all(body)
        .await
        .map_err(|e| format!("failed to send to {host}: {e}"))?;
    stream
        .flush()
        .await
        .map_err(|e| format!("failed to send to {host}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .await
        .map_err(|e| format!("failed to read from {host}: {e}"))?;
    parse_response(&raw).map_err(|e| format!("bad answer from {host}: {e}"))
}

/// The status code and body of a complete HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "headers are not UTF-8")?;
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let code: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked") {
            chunked = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else {
        match length {
            Some(n) if body.len() < n => {
                return Err(format!("body cut short: {} of {n} bytes", body.len()));
            }
            Some(n) => body[..n].to_vec(),
            None => body.to_vec(),
        }
    };
    Ok((code, body))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line cut short")?;
        let line = std::str::from_utf8(&body[..end]).map_err(|_| "bad chunk size")?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size")?;
        body = &body[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err("chunk cut short".to_string());
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn content_length_and_chunked_bodies_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(
            parse_response(plain).expect("plain"),
            (200, b"hello".to_vec())
        );
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).expect("chunked"),
            (200, b"hello".to_vec())
        );
        let short = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhello";
        assert!(parse_response(short).is_err());
        let error = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
        assert_eq!(parse_response(error).expect("503"), (503, b"busy".to_vec()));
    }

    /// A real socket: a server that answers one status, one that never answers, and a
    /// closed port, probed together within the timeout.
    #[tokio::test]
    async fn probes_run_in_parallel_and_a_hung_instance_only_times_out() {
        let status = PgStatus::stopped("demo-1", false);
        let body = serde_json::to_vec(&status).expect("json");
        let good = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = good.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = good.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            }
        });
        let got = get_status("127.0.0.1", port).await.expect("status");
        assert_eq!(got, status);

        let hung = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let hung_port = hung.local_addr().expect("addr").port();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = hung.accept().await {
                held.push(s);
            }
        });
        let pod = |name: &str, ip: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"podIP": ip},
            }))
            .expect("pod")
        };
        let started = std::time::Instant::now();
        let probes = probe_all_on(
            &[
                pod("a", Some("127.0.0.1")),
                pod("b", None),
                pod("c", Some("127.0.0.1")),
            ],
            hung_port,
        )
        .await;
        assert!(
            started.elapsed() < TIMEOUT * 2,
            "probes ran one after another"
        );
        assert!(matches!(&probes["a"], Probe::Unreachable(m) if m.contains("no answer")));
        assert!(matches!(&probes["b"], Probe::Unreachable(m) if m.contains("no IP")));
        assert_eq!(probes.len(), 3);
    }
}
