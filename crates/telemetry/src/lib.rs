//! OpenTelemetry traces for pgop's operator and instance managers, on `tracing`'s spans.
//!
//! - Every span gets a trace id and a span id ([`TraceLayer`]): a span's parent is the
//!   span it was entered in, or the remote parent its `traceparent` field names (an HTTP
//!   request's W3C Trace Context header, read strictly by [`SpanContext::from_traceparent`]).
//! - [`context_of`] gives a span's ids, to send on as `traceparent` ([`current_traceparent`])
//!   or to log as `trace_id` ([`record_trace_id`]).
//! - When the OpenTelemetry SDK's variables name an endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`
//!   or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), finished spans are batched and posted as
//!   OTLP/HTTP with the JSON encoding ([`Config`], [`Exporter`]). Without one nothing is
//!   copied or queued: a span costs its two ids.
//!
//! Field conventions on spans: `otel.kind = "server" | "client"`, `otel.name` (the
//! exported name), `error` (the span's status is ERROR with this message; an ERROR event
//! does the same), `traceparent` (the remote parent), `trace_id` (the log field this crate
//! fills; not exported as an attribute). Other fields are attributes, events are span
//! events.

mod context;
mod export;
mod layer;

pub use context::{SpanContext, SpanId, TraceId};
pub use export::{Config, Exporter, check_endpoint, encode};
pub use layer::{EventData, FinishedSpan, Kind, TraceLayer, Value};

use layer::{Sink, SpanData};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tracing_subscriber::registry::LookupSpan;

/// The HTTP header that carries a span's context to another process.
pub const TRACEPARENT: &str = "traceparent";

/// The target of spans made for traces only (a reconcile's steps, HTTP requests): log
/// output leaves them out ([`for_logs`]), so a log line's `span` stays the one that
/// names its subject (a reconcile's cluster and namespace).
pub const TRACE_ONLY: &str = "pgop::trace";

/// Whether traces take a span or event: pgop's own, at INFO and above, whatever the
/// log filter (`RUST_LOG`) says.
pub fn for_traces(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target().starts_with("pgop") && *metadata.level() <= tracing::Level::INFO
}

/// Whether logs take a span: all but [`TRACE_ONLY`]'s.
pub fn for_logs(metadata: &tracing::Metadata<'_>) -> bool {
    !(metadata.is_span() && metadata.target() == TRACE_ONLY)
}

/// The layer for `service` (`service.name` unless `OTEL_SERVICE_NAME` says otherwise), and
/// the exporter the environment asks for, if any (started on the current Tokio runtime).
/// An error names the variable that is wrong.
pub fn from_env(service: &str, version: &str) -> Result<(TraceLayer, Option<Exporter>), String> {
    with_config(Config::from_env(service, version)?)
}

/// [`from_env`] with the settings given.
pub fn with_config(config: Option<Config>) -> Result<(TraceLayer, Option<Exporter>), String> {
    match config {
        None => Ok((TraceLayer::ids_only(), None)),
        Some(config) => {
            let (exporter, sink) = Exporter::start(config)?;
            Ok((TraceLayer { sink: Some(sink) }, Some(exporter)))
        }
    }
}

/// A layer that sends every finished span to `sender` (tests read them from the other
/// end; a full channel drops the span).
pub fn to_channel(sender: tokio::sync::mpsc::Sender<FinishedSpan>) -> TraceLayer {
    TraceLayer {
        sink: Some(Sink {
            sender,
            dropped: Arc::new(AtomicU64::new(0)),
        }),
    }
}

/// The ids of `span`, when the subscriber it belongs to runs a [`TraceLayer`] on a
/// `tracing_subscriber` registry.
pub fn context_of(span: &tracing::Span) -> Option<SpanContext> {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let data = registry.span(id)?;
        let extensions = data.extensions();
        extensions.get::<SpanData>().map(|d| d.context)
    })
    .flatten()
}

/// The current span's `traceparent` header value, if it is in a trace.
pub fn current_traceparent() -> Option<String> {
    context_of(&tracing::Span::current()).map(|c| c.traceparent())
}

/// Fills `span`'s `trace_id` field (declared `trace_id = tracing::field::Empty`) with its
/// trace id, so that every log line inside it names the trace.
pub fn record_trace_id(span: &tracing::Span) {
    if let Some(context) = context_of(span) {
        span.record("trace_id", tracing::field::display(context.trace_id));
    }
}

/// Adds `traceparent` for the current span to an outgoing request's headers.
pub fn inject(headers: &mut http::HeaderMap) {
    if let Some(value) = current_traceparent()
        && let Ok(value) = http::HeaderValue::from_str(&value)
    {
        headers.insert(TRACEPARENT, value);
    }
}

/// The remote parent an incoming request names, as a canonical `traceparent` (what
/// arrived is never passed on as it was).
pub fn extract(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(TRACEPARENT)?.to_str().ok()?;
    SpanContext::from_traceparent(value.trim()).map(|c| c.traceparent())
}

#[cfg(test)]
mod tests;
