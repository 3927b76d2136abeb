//! Logging and tracing: one `init`, text or JSON logs, and OTLP/HTTP trace
//! export when an endpoint is configured.
//!
//! Spans follow the OpenTelemetry GenAI conventions (`gen_ai.*` on provider
//! calls); prompt text is recorded only when `telemetry_capture_content` is on.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

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

/// Installs the global subscriber. Call once, at start.
pub fn init(settings: &Settings) -> Result<TelemetryGuard, TelemetryError> {
    let filter =
        EnvFilter::try_new(&settings.telemetry.log).unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = match settings.telemetry.log_format {
        // Colours only for a person at a terminal, not for a log file.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
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
                .with_batch_exporter(exporter)
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
