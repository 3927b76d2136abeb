//! `[telemetry]`: logs and traces.

use clap::ArgAction;
use clap::builder::BoolishValueParser;

use super::{ConfigError, HttpUrl, LogFormat, OtlpProtocol, ResourceAttributes, invalid};

/// Logs and traces.
#[derive(Debug, Clone, clap::Args)]
pub struct TelemetrySettings {
    /// Log lines as text or json.
    #[arg(
        id = "telemetry.log_format",
        long = "log-format",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// tracing filter directives (RUST_LOG is read when this is not set).
    /// Targets and levels (`info,agent_harness::store=debug`) cost nothing
    /// at a span's entry; a span directive (`[turn]=debug`) takes a lock at
    /// every span entry and exit.
    #[arg(id = "telemetry.log", long = "log", default_value = "info")]
    pub log: String,
    /// OTLP/HTTP endpoint for traces [default: no trace export].
    #[arg(
        id = "telemetry.otlp_endpoint",
        long = "otel-exporter-otlp-endpoint",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        hide_env_values = true
    )]
    pub otlp_endpoint: Option<HttpUrl>,
    /// How spans are sent: http/protobuf or http/json (gRPC is not built
    /// in).
    #[arg(
        id = "telemetry.otlp_protocol",
        long = "otel-exporter-otlp-protocol",
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: OtlpProtocol,
    /// The `service.name` of the spans [default: `service.name` of
    /// OTEL_RESOURCE_ATTRIBUTES, else agent-harness].
    #[arg(
        id = "telemetry.service_name",
        long = "otel-service-name",
        env = "OTEL_SERVICE_NAME"
    )]
    pub service_name: Option<String>,
    /// More resource attributes of the spans, `key=value,key=value`
    /// (`service.name` here counts when OTEL_SERVICE_NAME is not set)
    /// [default: none].
    #[arg(
        id = "telemetry.resource_attributes",
        long = "otel-resource-attributes",
        env = "OTEL_RESOURCE_ATTRIBUTES"
    )]
    pub resource_attributes: Option<ResourceAttributes>,
    /// Record prompt and completion text on spans.
    #[arg(id = "telemetry.capture_content", long = "telemetry-capture-content", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub capture_content: bool,
    /// Keep message text out of decision records, spans and logs.
    #[arg(id = "telemetry.redact_logs", long = "redact-logs", default_value_t = false, action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub redact_logs: bool,
}

impl TelemetrySettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.log)
            .map(drop)
            .map_err(|e| invalid("HARNESS_LOG", e.to_string()))
    }
}
