//! The `tracing` layer: gives every span a place in a trace, and hands finished spans to
//! the exporter when there is one.

use crate::context::{SpanContext, SpanId, TraceId};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Most events kept per span (a span that logs more keeps its first ones).
const MAX_EVENTS: usize = 64;
/// Most attributes kept per span or event.
const MAX_ATTRIBUTES: usize = 64;
/// Longest attribute value kept, in bytes.
const MAX_VALUE: usize = 4096;

/// OTLP's span kinds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute's value, as OTLP types them.
#[derive(Clone, PartialEq, Debug)]
pub enum Value {
    String(String),
    Int(i64),
    Bool(bool),
    Double(f64),
}

#[derive(Clone, Debug)]
pub struct EventData {
    pub time: SystemTime,
    pub name: String,
    pub attributes: Vec<(String, Value)>,
}

/// A span as exported.
#[derive(Clone, Debug)]
pub struct FinishedSpan {
    pub context: SpanContext,
    pub parent: Option<SpanId>,
    pub name: String,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(String, Value)>,
    pub events: Vec<EventData>,
    /// The error that ended it, if one did (OTLP status code ERROR).
    pub error: Option<String>,
}

/// What a live span carries in its extensions.
pub(crate) struct SpanData {
    pub(crate) context: SpanContext,
    span: Option<FinishedSpan>,
}

/// Where finished spans go.
#[derive(Clone)]
pub(crate) struct Sink {
    pub(crate) sender: mpsc::Sender<FinishedSpan>,
    pub(crate) dropped: Arc<AtomicU64>,
}

/// The layer. Without a sink it only assigns ids (for `traceparent` and the `trace_id`
/// of log lines): no attribute is copied, nothing is queued.
pub struct TraceLayer {
    pub(crate) sink: Option<Sink>,
}

impl TraceLayer {
    /// Ids only, no export.
    pub fn ids_only() -> TraceLayer {
        TraceLayer { sink: None }
    }
}

/// Reads a span's or an event's fields: pgop's conventions first (`traceparent`, a
/// remote parent; `otel.kind`; `otel.name`; `error`), the rest as attributes.
struct Fields<'a> {
    keep: bool,
    remote: Option<SpanContext>,
    kind: Option<Kind>,
    name: Option<String>,
    error: Option<String>,
    message: Option<String>,
    attributes: &'a mut Vec<(String, Value)>,
}

fn cut(mut value: String) -> String {
    if value.len() > MAX_VALUE {
        let mut end = MAX_VALUE;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
    value
}

impl<'a> Fields<'a> {
    /// Reads into `attributes`; with `keep` false, only the conventions that place the
    /// span (`traceparent`, `otel.*`) are read.
    fn new(keep: bool, attributes: &'a mut Vec<(String, Value)>) -> Fields<'a> {
        Fields {
            keep,
            remote: None,
            kind: None,
            name: None,
            error: None,
            message: None,
            attributes,
        }
    }

    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "traceparent" => {
                if let Value::String(s) = &value {
                    self.remote = SpanContext::from_traceparent(s);
                }
            }
            "otel.kind" => {
                if let Value::String(s) = &value {
                    self.kind = match s.as_str() {
                        "server" => Some(Kind::Server),
                        "client" => Some(Kind::Client),
                        _ => Some(Kind::Internal),
                    };
                }
            }
            "otel.name" => {
                if let Value::String(s) = value {
                    self.name = Some(cut(s));
                }
            }
            "error" => {
                if self.keep {
                    self.error = Some(match value {
                        Value::String(s) => cut(s),
                        other => format!("{other:?}"),
                    });
                }
            }
            "message" => {
                if self.keep {
                    self.message = Some(match value {
                        Value::String(s) => cut(s),
                        other => format!("{other:?}"),
                    });
                }
            }
            // The log field that names the trace: the trace itself says it.
            "trace_id" => {}
            name => {
                if self.keep && self.attributes.len() < MAX_ATTRIBUTES {
                    let value = match value {
                        Value::String(s) => Value::String(cut(s)),
                        other => other,
                    };
                    self.attributes.retain(|(k, _)| k != name);
                    self.attributes.push((name.to_string(), value));
                }
            }
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        match i64::try_from(value) {
            Ok(v) => self.put(field, Value::Int(v)),
            Err(_) => self.put(field, Value::String(value.to_string())),
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::Double(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` arrives here as Display through Debug: no quotes are added.
        self.put(field, Value::String(format!("{value:?}")));
    }
}

impl<S> tracing_subscriber::Layer<S> for TraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let keep = self.sink.is_some();
        let mut attributes = Vec::new();
        let mut fields = Fields::new(keep, &mut attributes);
        attrs.record(&mut fields);
        let (remote, kind, name, error) = (fields.remote, fields.kind, fields.name, fields.error);
        let parent = remote.or_else(|| {
            span.parent()
                .and_then(|p| p.extensions().get::<SpanData>().map(|d| d.context))
        });
        let context = SpanContext {
            trace_id: parent.map_or_else(TraceId::random, |p| p.trace_id),
            span_id: SpanId::random(),
            sampled: parent.is_none_or(|p| p.sampled),
        };
        let now = SystemTime::now();
        let finished = (keep && context.sampled).then(|| FinishedSpan {
            context,
            parent: parent.map(|p| p.span_id),
            name: name.unwrap_or_else(|| attrs.metadata().name().to_string()),
            kind: kind.unwrap_or(Kind::Internal),
            start: now,
            end: now,
            attributes,
            events: Vec::new(),
            error,
        });
        span.extensions_mut().insert(SpanData {
            context,
            span: finished,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if self.sink.is_none() {
            return;
        }
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(SpanData {
            span: Some(finished),
            ..
        }) = extensions.get_mut::<SpanData>()
        else {
            return;
        };
        let mut fields = Fields::new(true, &mut finished.attributes);
        values.record(&mut fields);
        let (kind, name, error) = (fields.kind, fields.name, fields.error);
        if let Some(kind) = kind {
            finished.kind = kind;
        }
        if let Some(name) = name {
            finished.name = name;
        }
        if error.is_some() {
            finished.error = error;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if self.sink.is_none() {
            return;
        }
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(SpanData {
            span: Some(finished),
            ..
        }) = extensions.get_mut::<SpanData>()
        else {
            return;
        };
        let level = *event.metadata().level();
        let mut attributes = vec![(
            "level".to_string(),
            Value::String(level.as_str().to_string()),
        )];
        let mut fields = Fields::new(true, &mut attributes);
        event.record(&mut fields);
        let (message, error) = (fields.message, fields.error);
        if let Some(error) = &error {
            attributes.push(("error".to_string(), Value::String(error.clone())));
        }
        let name = message.unwrap_or_else(|| event.metadata().name().to_string());
        if level == Level::ERROR && finished.error.is_none() {
            finished.error = Some(error.unwrap_or_else(|| name.clone()));
        }
        if finished.events.len() < MAX_EVENTS {
            finished.events.push(EventData {
                time: SystemTime::now(),
                name,
                attributes,
            });
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(sink) = &self.sink else {
            return;
        };
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let finished = span
            .extensions_mut()
            .get_mut::<SpanData>()
            .and_then(|d| d.span.take());
        if let Some(mut finished) = finished {
            finished.end = SystemTime::now();
            // A full queue (an exporter that cannot keep up) drops the span, counted,
            // rather than holding the caller or growing without bound.
            if sink.sender.try_send(finished).is_err() {
                sink.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
