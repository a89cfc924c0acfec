use super::*;
use std::collections::HashMap;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;

fn vars(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = list
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

/// Runs `f` with a subscriber (this thread only) whose spans end up in the returned list.
fn collect(f: impl FnOnce()) -> Vec<FinishedSpan> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel(1024);
    let subscriber = tracing_subscriber::registry().with(to_channel(sender));
    tracing::subscriber::with_default(subscriber, f);
    let mut spans = Vec::new();
    while let Ok(span) = receiver.try_recv() {
        spans.push(span);
    }
    spans
}

fn find<'a>(spans: &'a [FinishedSpan], name: &str) -> &'a FinishedSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name} in {spans:#?}"))
}

#[test]
fn children_share_the_trace_and_name_their_parent() {
    let mut seen = None;
    let spans = collect(|| {
        let root = tracing::info_span!(
            "reconcile",
            cluster = "db",
            trace_id = tracing::field::Empty
        );
        root.in_scope(|| {
            let child = tracing::info_span!("apply", objects = 3_u64, ok = true);
            child.in_scope(|| {
                tracing::info!(reason = "Created", "created the primary");
                seen = current_traceparent();
            });
            tracing::info_span!("status", otel.name = "write status").in_scope(|| {
                tracing::error!(error = "conflict", "status write refused");
            });
        });
        record_trace_id(&root);
    });
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let (root, apply, status) = (
        find(&spans, "reconcile"),
        find(&spans, "apply"),
        find(&spans, "write status"),
    );
    assert_eq!(root.parent, None);
    assert_eq!(apply.parent, Some(root.context.span_id));
    assert_eq!(status.parent, Some(root.context.span_id));
    assert!(
        spans
            .iter()
            .all(|s| s.context.trace_id == root.context.trace_id)
    );
    assert_ne!(apply.context.span_id, status.context.span_id);
    assert_eq!(
        root.attributes,
        vec![("cluster".to_string(), Value::String("db".into()))]
    );
    assert!(
        apply
            .attributes
            .contains(&("objects".into(), Value::Int(3)))
    );
    assert!(apply.attributes.contains(&("ok".into(), Value::Bool(true))));
    assert_eq!(apply.events.len(), 1);
    assert_eq!(apply.events[0].name, "created the primary");
    assert!(
        apply.events[0]
            .attributes
            .contains(&("reason".into(), Value::String("Created".into())))
    );
    assert_eq!(apply.error, None);
    assert_eq!(status.error.as_deref(), Some("conflict"));
    assert!(root.end >= apply.end && apply.end >= apply.start);
    // The header sent from inside `apply` names apply's span in the same trace.
    let seen = SpanContext::from_traceparent(&seen.expect("a traceparent")).expect("valid");
    assert_eq!(seen.trace_id, root.context.trace_id);
    assert_eq!(seen.span_id, apply.context.span_id);
}

#[test]
fn a_traceparent_field_makes_a_remote_parent_and_garbage_is_ignored() {
    let remote = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let spans = collect(|| {
        tracing::info_span!("request", otel.kind = "server", traceparent = remote).in_scope(|| {
            tracing::info_span!("promote").in_scope(|| {});
        });
        tracing::info_span!("request2", traceparent = "00-$(reboot)-x-01\nforged").in_scope(|| {});
    });
    let request = find(&spans, "request");
    assert_eq!(request.kind, Kind::Server);
    assert_eq!(
        request.context.trace_id,
        TraceId(0x4bf92f3577b34da6a3ce929d0e0e4736)
    );
    assert_eq!(request.parent, Some(SpanId(0x00f067aa0ba902b7)));
    assert!(request.attributes.is_empty(), "{:?}", request.attributes);
    let promote = find(&spans, "promote");
    assert_eq!(promote.context.trace_id, request.context.trace_id);
    assert_eq!(promote.parent, Some(request.context.span_id));
    let other = find(&spans, "request2");
    assert_eq!(other.parent, None);
    assert_ne!(other.context.trace_id, request.context.trace_id);
}

#[test]
fn without_an_exporter_spans_have_ids_and_nothing_is_kept() {
    let subscriber = tracing_subscriber::registry().with(TraceLayer::ids_only());
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("reconcile");
        let outer = context_of(&span).expect("ids");
        span.in_scope(|| {
            let inner = tracing::info_span!("apply");
            let inner = context_of(&inner).expect("ids");
            assert_eq!(inner.trace_id, outer.trace_id);
            assert_ne!(inner.span_id, outer.span_id);
        });
    });
    // No subscriber with the layer: no ids.
    assert_eq!(context_of(&tracing::info_span!("elsewhere")), None);
}

#[test]
fn hostile_headers_are_not_passed_on() {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        TRACEPARENT,
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    assert_eq!(
        extract(&headers).as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    headers.insert(
        TRACEPARENT,
        http::HeaderValue::from_static("00-'; drop table t; --"),
    );
    assert_eq!(extract(&headers), None);
}

#[test]
fn configuration_follows_the_sdk_variables() {
    assert_eq!(
        Config::from_vars("pgop-operator", "1.0.0", vars(&[])),
        Ok(None)
    );
    let config = Config::from_vars(
        "pgop-operator",
        "1.0.0",
        vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.namespace.name=pgop,team=db%20ops",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ]),
    )
    .expect("valid")
    .expect("enabled");
    assert_eq!(config.endpoint, "http://collector:4318/v1/traces");
    assert_eq!(config.delay, Duration::from_millis(200));
    assert_eq!(
        config.headers,
        vec![("authorization".to_string(), "Bearer x".to_string())]
    );
    assert_eq!(
        config.resource,
        vec![
            ("service.name".to_string(), "pgop-operator".to_string()),
            ("service.version".to_string(), "1.0.0".to_string()),
            ("k8s.namespace.name".to_string(), "pgop".to_string()),
            ("team".to_string(), "db ops".to_string()),
        ]
    );
    // The traces endpoint is used as given.
    let config = Config::from_vars(
        "s",
        "v",
        vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://b/otlp/traces",
            ),
            ("OTEL_SERVICE_NAME", "mine"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=theirs"),
        ]),
    )
    .expect("valid")
    .expect("enabled");
    assert_eq!(config.endpoint, "https://b/otlp/traces");
    assert_eq!(config.resource[0], ("service.name".into(), "mine".into()));
    // Switched off.
    for off in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ] {
        assert_eq!(
            Config::from_vars(
                "s",
                "v",
                vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), off])
            ),
            Ok(None)
        );
    }
    // Each wrong value is an error naming its variable.
    for (bad, name) in [
        (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "file:///etc/passwd"),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-a=b\nc"),
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=1"),
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (("OTEL_BSP_SCHEDULE_DELAY", "5s"), "OTEL_BSP_SCHEDULE_DELAY"),
        (("OTEL_TRACES_EXPORTER", "zipkin"), "OTEL_TRACES_EXPORTER"),
    ] {
        let mut list = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318")];
        list.retain(|(k, _)| *k != bad.0);
        list.push(bad);
        let error = Config::from_vars("s", "v", vars(&list)).expect_err(&format!("{bad:?}"));
        assert!(error.starts_with(name), "{bad:?}: {error}");
    }
}

/// The exporter against a real HTTP server that decodes what it receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_receiver_as_json() {
    use axum::routing::post;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, serde_json::Value)>();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let kind = headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let _ = tx.send((kind, value));
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let config = Config::from_vars(
        "pgop-test",
        "9.9.9",
        vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
        ]),
    )
    .expect("valid")
    .expect("enabled");
    let (layer, exporter) = with_config(Some(config)).expect("started");
    let exporter = exporter.expect("an exporter");
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("reconcile", cluster = "db").in_scope(|| {
            tracing::info_span!("probe", instances = 2_i64).in_scope(|| {});
        });
    });
    // A minute's delay: only the shutdown sends them.
    exporter.shutdown(Duration::from_secs(30)).await;
    let (kind, body) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("an export within 30 s")
        .expect("a body");
    assert_eq!(kind, "application/json");
    let resource = &body["resourceSpans"][0];
    let attributes = resource["resource"]["attributes"]
        .as_array()
        .expect("attributes");
    assert!(attributes.contains(
        &serde_json::json!({"key": "service.name", "value": {"stringValue": "pgop-test"}})
    ));
    let spans = resource["scopeSpans"][0]["spans"]
        .as_array()
        .expect("spans");
    assert_eq!(spans.len(), 2, "{body:#}");
    let probe = spans.iter().find(|s| s["name"] == "probe").expect("probe");
    let reconcile = spans
        .iter()
        .find(|s| s["name"] == "reconcile")
        .expect("reconcile");
    assert_eq!(probe["traceId"], reconcile["traceId"]);
    assert_eq!(probe["parentSpanId"], reconcile["spanId"]);
    assert!(reconcile.get("parentSpanId").is_none());
    assert_eq!(probe["traceId"].as_str().map(str::len), Some(32));
    assert_eq!(probe["spanId"].as_str().map(str::len), Some(16));
    assert_eq!(
        probe["attributes"][0],
        serde_json::json!({"key": "instances", "value": {"intValue": "2"}})
    );
    let start: u128 = probe["startTimeUnixNano"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("start");
    let end: u128 = probe["endTimeUnixNano"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("end");
    assert!(end >= start && start > 0);
}

/// A collector that is not there costs the spans, counted, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_drops_spans_and_counts_them() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let config = Config::from_vars(
        "pgop-test",
        "9.9.9",
        vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}"))]),
    )
    .expect("valid");
    let (layer, exporter) = with_config(config).expect("started");
    let exporter = exporter.expect("an exporter");
    // Kept until the end: dropping the subscriber closes the queue, which flushes it.
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..3 {
            tracing::info_span!("lost").in_scope(|| {});
        }
    });
    assert_eq!(
        exporter.dropped(),
        0,
        "nothing is dropped before the export is tried"
    );
    assert_eq!(exporter.shutdown(Duration::from_secs(30)).await, 3);
    drop(dispatch);
}
