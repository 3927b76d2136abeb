//! Logging and tracing: one `init`, text or JSON logs, and OTLP/HTTP trace
//! export when an endpoint is configured.
//!
//! Spans follow the OpenTelemetry GenAI conventions (`gen_ai.*` on provider
//! calls); prompt text is recorded only when `telemetry_capture_content` is on.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

use crate::config::{LogFormat, Settings};

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
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .with_headers(Default::default())
                .build()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name("agent-harness")
                        .build(),
                )
                .build();
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
