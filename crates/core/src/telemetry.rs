//! Logging and tracing: one `init`, text or JSON logs, and OTLP/HTTP trace
//! export when an endpoint is configured.
//!
//! Spans follow the OpenTelemetry GenAI conventions (`gen_ai.*` on provider
//! calls); prompt text is recorded only when `telemetry_capture_content` is on.
//! With `HARNESS_REDACT_LOGS` every log line and every exported span (its
//! name, attributes, events and status) is masked (see [`crate::pii`]).

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_subscriber::{
    EnvFilter, Layer, Registry, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt,
};

use crate::config::{LogFormat, OtlpProtocol, Settings, TelemetrySettings};

/// Flushes and stops trace export when dropped or shut down.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports what is buffered and stops the exporter.
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("trace export did not shut down cleanly: {e}");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_ENDPOINT: cannot build the exporter: {0}")]
    Exporter(String),
}

/// The spans' resource, from the settings only (OTEL_SERVICE_NAME and
/// OTEL_RESOURCE_ATTRIBUTES come through them): `service.name` is
/// OTEL_SERVICE_NAME, else the attributes' `service.name`, else
/// `agent-harness`; the instance id is `service.instance.id` unless the
/// attributes name one.
fn resource(telemetry: &TelemetrySettings, instance_id: &str) -> Resource {
    let attributes = telemetry
        .resource_attributes
        .as_ref()
        .map(|a| a.0.as_slice())
        .unwrap_or_default();
    let named = |key: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let service = telemetry
        .service_name
        .clone()
        .or_else(|| named("service.name"))
        .unwrap_or_else(|| "agent-harness".to_owned());
    Resource::builder_empty()
        .with_attributes(
            attributes
                .iter()
                .filter(|(k, _)| k != "service.name")
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_attribute(KeyValue::new(
            "service.instance.id",
            named("service.instance.id").unwrap_or_else(|| instance_id.to_owned()),
        ))
        .with_attribute(KeyValue::new(
            "service.version",
            named("service.version").unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
        ))
        .with_service_name(service)
        .build()
}

/// The trace context of an incoming request's `traceparent`/`tracestate`
/// headers (none without trace export).
pub fn remote_context(headers: &axum::http::HeaderMap) -> opentelemetry::Context {
    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl opentelemetry::propagation::Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(axum::http::HeaderName::as_str).collect()
        }
    }
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&Headers(headers))
    })
}

/// The trace context of `span` as a W3C `traceparent` header value (none
/// when traces are not exported).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let context = span.context();
    let of = context.span().span_context().clone();
    of.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            of.trace_id(),
            of.span_id(),
            of.trace_flags().to_u8()
        )
    })
}

/// Links `span` to the span a `traceparent` (as [`traceparent`] wrote it)
/// names, so that a trace viewer joins the two; a value that is no
/// `traceparent` is left alone.
pub fn link_to(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let mut fields = traceparent.split('-');
    let (Some("00"), Some(trace), Some(id), Some(flags), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return;
    };
    let (Ok(trace), Ok(id), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(id),
        u8::from_str_radix(flags, 16),
    ) else {
        return;
    };
    let linked = SpanContext::new(
        trace,
        id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Installs the global subscriber. Call once, at start.
pub fn init(settings: &Settings) -> Result<TelemetryGuard, TelemetryError> {
    let filter = log_filter(&settings.telemetry.log).into_layer();
    let redact = settings.telemetry.redact_logs;
    // Lines are masked one whole line at a time, and only when asked: by
    // default they go to standard output as tracing writes them.
    let output = || {
        if redact {
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(MaskedLines)
        } else {
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stdout)
        }
    };
    let fmt = match settings.telemetry.log_format {
        // Colours only for a person at a terminal, not for a log file (nor
        // for masked lines: an escape code could split what is masked).
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(!redact && std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .with_writer(output())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(output())
            .boxed(),
    };
    let (otel, provider) = match &settings.telemetry.otlp_endpoint {
        Some(endpoint) => {
            let endpoint = endpoint.as_str().trim_end_matches('/');
            let endpoint = if endpoint.ends_with("/v1/traces") {
                endpoint.to_owned()
            } else {
                format!("{endpoint}/v1/traces")
            };
            let protocol = match settings.telemetry.otlp_protocol {
                OtlpProtocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
                OtlpProtocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
            };
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(protocol)
                .with_endpoint(endpoint)
                .with_headers(Default::default())
                .build()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(MaskedSpans {
                    inner: exporter,
                    redact,
                })
                .with_resource(resource(&settings.telemetry, &settings.server.instance_id))
                .build();
            // An incoming `traceparent` (W3C) continues the caller's trace.
            opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
            let tracer = provider.tracer("agent-harness");
            (
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
                Some(provider),
            )
        }
        None => (None, None),
    };
    // A second init (tests building several apps) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(TelemetryGuard { provider })
}

/// What decides which spans and log lines are recorded (`HARNESS_LOG`).
#[derive(Debug)]
enum LogFilter {
    /// Targets and levels only (`info`, `agent_harness=debug,hyper=warn`):
    /// decided once for each call site, and entering or leaving a span
    /// costs it nothing.
    Static(Box<Targets>),
    /// Span and field directives (`[turn]=debug`): `EnvFilter`, which takes
    /// a lock and keeps a stack of levels at every span entry and exit.
    /// A streamed token enters several spans (the request's at each frame
    /// of its body, the turn's and the step's at each poll), so that is
    /// paid only where a directive needs it.
    Dynamic(Box<EnvFilter>),
}

impl LogFilter {
    /// The filter as the subscriber's first layer.
    fn into_layer(self) -> Box<dyn Layer<Registry> + Send + Sync> {
        match self {
            LogFilter::Static(targets) => (*targets).boxed(),
            LogFilter::Dynamic(directives) => (*directives).boxed(),
        }
    }
}

/// The filter `HARNESS_LOG` asks for; `info` when it cannot be read (the
/// setting is checked at start: `TelemetrySettings::validate`).
fn log_filter(directives: &str) -> LogFilter {
    // Only a span directive (`target[span{field=value}]=level`) is dynamic.
    if !directives.contains('[')
        && EnvFilter::try_new(directives).is_ok()
        && let Ok(targets) = directives.parse::<Targets>()
    {
        return LogFilter::Static(Box::new(targets));
    }
    LogFilter::Dynamic(Box::new(
        EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info")),
    ))
}

/// Standard output, each log line masked.
struct MaskedLines;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for MaskedLines {
    type Writer = MaskedLine;

    fn make_writer(&'a self) -> MaskedLine {
        MaskedLine { line: Vec::new() }
    }
}

/// One formatted event: kept until it is whole, then written masked in
/// one piece.
struct MaskedLine {
    line: Vec<u8>,
}

impl std::io::Write for MaskedLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for MaskedLine {
    fn drop(&mut self) {
        use std::io::Write as _;
        let line = String::from_utf8_lossy(&self.line);
        let line = crate::pii::redact(&line);
        // A log line that cannot be written has nowhere else to go.
        let _ = std::io::stdout().lock().write_all(line.as_bytes());
    }
}

/// The OTLP exporter, each span masked when asked.
#[derive(Debug)]
struct MaskedSpans<E> {
    inner: E,
    redact: bool,
}

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter
    for MaskedSpans<E>
{
    fn export(
        &self,
        mut batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        if self.redact {
            batch.iter_mut().for_each(mask_span);
        }
        self.inner.export(batch)
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Masks the text of a span: its name, string attributes, events (a log
/// line inside a span is one) and status.
fn mask_span(span: &mut opentelemetry_sdk::trace::SpanData) {
    use std::borrow::Cow;
    if let Cow::Owned(name) = crate::pii::redact(&span.name) {
        span.name = name.into();
    }
    mask_attributes(&mut span.attributes);
    for event in &mut span.events.events {
        if let Cow::Owned(name) = crate::pii::redact(&event.name) {
            event.name = name.into();
        }
        mask_attributes(&mut event.attributes);
    }
    if let opentelemetry::trace::Status::Error { description } = &mut span.status
        && let Cow::Owned(masked) = crate::pii::redact(description)
    {
        *description = masked.into();
    }
}

fn mask_attributes(attributes: &mut [KeyValue]) {
    use opentelemetry::{Array, StringValue, Value};
    let mask = |text: &StringValue| match crate::pii::redact(text.as_str()) {
        std::borrow::Cow::Owned(masked) => Some(StringValue::from(masked)),
        std::borrow::Cow::Borrowed(_) => None,
    };
    for attribute in attributes {
        match &mut attribute.value {
            Value::String(text) => {
                if let Some(masked) = mask(text) {
                    *text = masked;
                }
            }
            Value::Array(Array::String(texts)) => {
                for text in texts {
                    if let Some(masked) = mask(text) {
                        *text = masked;
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Each event a subscriber records, as `target level`.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> Layer<S> for Seen {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let meta = event.metadata();
            let line = format!("{} {}", meta.target(), meta.level());
            self.0.lock().unwrap().push(line);
        }
    }

    /// What a subscriber with `filter` records of the same events, inside
    /// and outside a span named `turn`.
    fn recorded(filter: Box<dyn Layer<Registry> + Send + Sync>) -> Vec<String> {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "agent_harness::runner", "info");
            tracing::debug!(target: "agent_harness::runner", "debug");
            tracing::debug!(target: "agent_harness::store", "debug");
            tracing::trace!(target: "agent_harness::store", "trace");
            tracing::warn!(target: "hyper::proto", "warn");
            tracing::info!(target: "hyper::proto", "info");
            tracing::error!(target: "h2", "error");
            let span = tracing::info_span!(target: "agent_harness::runner", "turn");
            let _entered = span.enter();
            tracing::debug!(target: "agent_harness::store", "debug in turn");
        });
        seen.0.lock().unwrap().clone()
    }

    #[test]
    fn targets_and_levels_need_no_filter_at_span_entry_and_record_the_same() {
        for directives in [
            "info",
            "warn",
            "agent_harness=debug,hyper=warn",
            "info,agent_harness::store=trace",
            "off",
            "agent_harness",
        ] {
            let filter = log_filter(directives);
            assert!(
                matches!(filter, LogFilter::Static(_)),
                "{directives}: {filter:?}"
            );
            let dynamic = EnvFilter::try_new(directives).unwrap().boxed();
            assert_eq!(
                recorded(filter.into_layer()),
                recorded(dynamic),
                "{directives}"
            );
        }
        // The filter is not a no-op: the levels asked for are what is kept.
        assert_eq!(
            recorded(log_filter("agent_harness=debug,hyper=warn").into_layer()),
            [
                "agent_harness::runner INFO",
                "agent_harness::runner DEBUG",
                "agent_harness::store DEBUG",
                "hyper::proto WARN",
                "agent_harness::store DEBUG",
            ]
        );
    }

    #[test]
    fn a_span_directive_keeps_the_filter_that_reads_spans() {
        let filter = log_filter("info,[turn]=debug");
        assert!(matches!(filter, LogFilter::Dynamic(_)), "{filter:?}");
        // Inside the turn's span the store's debug line is kept, outside
        // it is not.
        let lines = recorded(filter.into_layer());
        assert!(
            lines.contains(&"agent_harness::store DEBUG".to_owned()),
            "{lines:?}"
        );
        assert_eq!(
            lines.iter().filter(|l| l.ends_with("DEBUG")).count(),
            1,
            "{lines:?}"
        );
        // What cannot be read is `info`, as before.
        let filter = log_filter("agent_harness=loud");
        assert!(matches!(filter, LogFilter::Dynamic(_)), "{filter:?}");
        assert_eq!(
            recorded(filter.into_layer()),
            [
                "agent_harness::runner INFO",
                "hyper::proto WARN",
                "hyper::proto INFO",
                "h2 ERROR"
            ]
        );
    }
}
