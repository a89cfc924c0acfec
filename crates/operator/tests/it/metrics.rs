//! The operator's `/metrics`, `/healthz` and `/readyz` against a real API server (testenv):
//! started on a free loopback port, as `pgop dev` does.

use crate::common;

use common::*;
use pgop_operator::cluster::probe;
use pgop_testenv::wait;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn loopback_any_port() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// `GET path`: the status code and body, or why there is none.
async fn get(host: &str, path: &str) -> Result<(u16, String), String> {
    let (code, body) = probe::request(host, "GET", path, None).await?;
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// The value of the sample that is exactly `series` (`name{labels}`), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The response head of `GET /metrics`, lower-cased.
async fn metrics_head(host: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let (head, _) = raw.split_once("\r\n\r\n").ok_or("no end of headers")?;
    Ok(head.to_string())
}

#[tokio::test]
async fn the_operator_serves_metrics_health_and_readiness() -> Result {
    let (_plane, client, ns) = setup("op-metrics").await?;
    let n = ns.name().to_string();
    let options = pgop_operator::Options {
        namespaces: vec![n.clone()],
        metrics_bind_address: loopback_any_port(),
        ..pgop_operator::Options::default()
    };
    let operator = pgop_operator::Operator::bind(client.clone(), options).await?;
    let addr = operator.metrics_address().ok_or("no metrics address")?;
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 0, "port 0 is resolved to the bound port");
    let host = addr.to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(operator.run(async move {
        let _ = stopped.await;
    }));

    create(&client, &n, &cluster("watched", 2)).await?;

    wait::until("/readyz 200", TIMEOUT, || async {
        match get(&host, "/readyz").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await?;
    assert_eq!(get(&host, "/healthz").await?.0, 200);

    let instances = format!(r#"pgop_cluster_instances{{namespace="{n}",cluster="watched"}}"#);
    let ok = r#"pgop_operator_reconciles_total{controller="cluster",result="ok"}"#;
    let text = wait::until(
        "the cluster and its reconciles on /metrics",
        TIMEOUT,
        || async {
            let (code, text) = get(&host, "/metrics").await?;
            if code != 200 {
                return Err(format!("{code}: {text}"));
            }
            match (sample(&text, &instances), sample(&text, ok)) {
                (Some(_), Some(count)) if count > 0.0 => Ok(text),
                _ => Err(text),
            }
        },
    )
    .await?;
    assert_eq!(sample(&text, &instances), Some(2.0), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // The reconcile was timed, too.
    let timed = sample(
        &text,
        r#"pgop_operator_reconcile_duration_seconds_count{controller="cluster"}"#,
    )
    .ok_or("no reconcile durations")?;
    assert!(timed >= 1.0, "{text}");
    let head = metrics_head(&host).await?;
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    assert!(get(&host, "/nothing").await?.0 == 404);

    // The endpoints stop with the controllers.
    let _ = stop.send(());
    tokio::time::timeout(pgop_operator::SHUTDOWN_GRACE * 2, task).await???;
    assert!(
        tokio::net::TcpStream::connect(&host).await.is_err(),
        "{host} still accepts connections after the operator stopped"
    );
    Ok(())
}

#[tokio::test]
async fn a_metrics_address_in_use_is_an_error_naming_it() -> Result {
    let (_plane, client, ns) = setup("op-metrics-busy").await?;
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = taken.local_addr()?;
    let options = pgop_operator::Options {
        namespaces: vec![ns.name().to_string()],
        metrics_bind_address: Some(addr),
        ..pgop_operator::Options::default()
    };
    let never = async {};
    match pgop_operator::run(client, options, never).await {
        Ok(()) => Err(format!("the operator ran although {addr} is taken").into()),
        Err(e) => {
            let message = pgop_operator::error_chain(&e);
            assert!(message.contains(&addr.to_string()), "{message}");
            Ok(())
        }
    }
}
