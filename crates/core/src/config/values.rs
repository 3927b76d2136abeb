//! The typed values of settings that are more than a number: each parses
//! from the text an operator writes (flag, variable or file) and says what
//! is wrong with it.

use std::{fmt, str::FromStr};

/// A value that must never be printed (an API key): its `Debug` and
/// `Display` say `<redacted>`; [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.trim().to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Whether requests need an API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every request but the probes, the page and the document needs a key.
    On,
    /// No key is asked for (local use).
    Off,
    /// On, unless the service listens on a loopback address only.
    Auto,
}

/// The OTLP exporter's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    #[value(name = "http/protobuf")]
    HttpProtobuf,
    #[value(name = "http/json")]
    HttpJson,
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs separated by commas, each
/// part percent-decoded (the OpenTelemetry specification's format).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceAttributes(pub Vec<(String, String)>);

impl std::str::FromStr for ResourceAttributes {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let decode = |part: &str| {
            percent_encoding::percent_decode_str(part.trim())
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| format!("{part:?} is not UTF-8 once decoded"))
        };
        let mut pairs = Vec::new();
        for pair in raw.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(format!("{pair:?} is not key=value"));
            };
            let key = decode(key)?;
            if key.is_empty() {
                return Err(format!("{pair:?} has no key"));
            }
            pairs.push((key, decode(value)?));
        }
        Ok(Self(pairs))
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A provider adapter the service has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
    Ollama,
    /// The stand-in model that needs no key (`demo:echo`).
    Demo,
}

impl ProviderKind {
    /// The name a chain entry and a turn's `runtime_provider` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Ollama => "ollama",
            Self::Demo => "demo",
        }
    }
}

impl FromStr for ProviderKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "openai" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            "ollama" => Ok(Self::Ollama),
            "demo" => Ok(Self::Demo),
            other => Err(format!(
                "unknown provider {other:?} (openai, anthropic, ollama, demo)"
            )),
        }
    }
}

/// One entry of the provider chain: an adapter and the model it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRef {
    pub kind: ProviderKind,
    pub model: String,
}

/// The provider chain, `name:model` in order of preference, e.g.
/// `openai:gpt-4o-mini,anthropic:claude-sonnet-4-6`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderList(pub Vec<ProviderRef>);

impl FromStr for ProviderList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let entries = s
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (name, model) = entry
                    .split_once(':')
                    .ok_or_else(|| format!("{entry:?} is not provider:model"))?;
                let model = model.trim();
                if model.is_empty() {
                    return Err(format!("{entry:?} names no model"));
                }
                Ok(ProviderRef {
                    kind: name.parse()?,
                    model: model.to_owned(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if entries.is_empty() {
            return Err("lists no provider".to_owned());
        }
        Ok(Self(entries))
    }
}

/// The model the vault's chunks are embedded with: `openai:{model}` (the
/// OpenAI-compatible `/embeddings` at the OpenAI base URL) or
/// `ollama:{model}` (`/api/embed` at the Ollama host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingModel(pub ProviderRef);

impl FromStr for EmbeddingModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let ProviderList(mut list) = s.parse()?;
        let (Some(entry), true) = (list.pop(), list.is_empty()) else {
            return Err("name one provider:model".to_owned());
        };
        if matches!(entry.kind, ProviderKind::Anthropic | ProviderKind::Demo) {
            return Err(
                "that provider has no embeddings endpoint: use openai:… or ollama:…".into(),
            );
        }
        Ok(Self(entry))
    }
}

/// Effect classes, comma-separated (`LOCAL_WRITE,DESTRUCTIVE`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectList(pub Vec<crate::tools::EffectClass>);

impl FromStr for EffectList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use crate::tools::EffectClass;
        let mut effects = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let effect = match name.to_ascii_uppercase().as_str() {
                "READ_ONLY" => EffectClass::ReadOnly,
                "LOCAL_WRITE" => EffectClass::LocalWrite,
                "NETWORK" => EffectClass::Network,
                "DESTRUCTIVE" => EffectClass::Destructive,
                _ => {
                    return Err(format!(
                        "unknown effect class {name:?} (READ_ONLY, LOCAL_WRITE, NETWORK, DESTRUCTIVE)"
                    ));
                }
            };
            if !effects.contains(&effect) {
                effects.push(effect);
            }
        }
        Ok(Self(effects))
    }
}

/// A span of time: whole numbers with units, `ms`, `s`, `m`, `h` or `d`,
/// one after another (`24h`, `1h30m`, `3s`, `0s`), at most 10 years.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub std::time::Duration);

/// The longest [`Span`].
const SPAN_MAX: std::time::Duration = std::time::Duration::from_secs(3650 * 24 * 60 * 60);

impl Span {
    /// A span of at most 30 days (the longest a call waits for an answer).
    pub fn of_a_wait(s: &str) -> Result<Self, String> {
        let span: Self = s.parse()?;
        if span.0 > std::time::Duration::from_secs(30 * 24 * 60 * 60) {
            return Err(format!("{s:?} is longer than 30 days"));
        }
        Ok(span)
    }
}

impl FromStr for Span {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let shape = || format!("{s:?} is not a span such as 24h, 90m, 3s or 1h30m");
        let mut total: u128 = 0;
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(shape());
        }
        // Bounded: each piece takes at least two characters of `rest`.
        while !rest.is_empty() {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let unit_len = rest[digits..]
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len() - digits);
            if digits == 0 || digits > 12 || unit_len == 0 {
                return Err(shape());
            }
            let number: u128 = rest[..digits].parse().map_err(|_| shape())?;
            let millis_per = match &rest[digits..digits + unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(shape()),
            };
            total = total.saturating_add(number.saturating_mul(millis_per));
            rest = &rest[digits + unit_len..];
        }
        let span = std::time::Duration::from_millis(u64::try_from(total).unwrap_or(u64::MAX));
        if span > SPAN_MAX {
            return Err(format!("{s:?} is longer than 10 years"));
        }
        Ok(Self(span))
    }
}

/// Origins allowed to call the API from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    Any,
    List(Vec<String>),
}

impl FromStr for CorsOrigins {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let listed: Vec<&str> = s
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        if listed.is_empty() {
            return Err("lists no origin (leave it unset to allow none)".to_owned());
        }
        if listed == ["*"] {
            return Ok(Self::Any);
        }
        let mut origins = Vec::with_capacity(listed.len());
        for origin in listed {
            let url = reqwest::Url::parse(origin)
                .map_err(|e| format!("{origin:?} is not an origin: {e}"))?;
            let bare = matches!(url.scheme(), "http" | "https")
                && url.host_str().is_some()
                && url.path() == "/"
                && !origin.ends_with('/')
                && url.query().is_none()
                && url.username().is_empty();
            if !bare {
                return Err(format!(
                    "{origin:?} is not an origin: use scheme://host[:port], or `*` alone"
                ));
            }
            origins.push(origin.to_owned());
        }
        Ok(Self::List(origins))
    }
}

/// An `http` or `https` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpUrl(String);

impl HttpUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for HttpUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match reqwest::Url::parse(s) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(Self(s.to_owned())),
            Ok(_) => Err("must be an http or https URL".to_owned()),
            Err(e) => Err(format!("not a URL: {e}")),
        }
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Shows a key in the URL's query (`?api-key=…`) and a password in it
/// (`user:…@`) as `[redacted]`.
impl fmt::Debug for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = crate::providers::redact::Redactor::default().text(&self.0);
        fmt::Debug::fmt(&shown, f)
    }
}

/// A server's address as its variable gives it (`OLLAMA_HOST`: a URL, or
/// `host:port`); `Debug` hides a password in it.
#[derive(Clone, PartialEq, Eq)]
pub struct HostUrl(String);

impl HostUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for HostUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(Self(s.trim().to_owned()))
    }
}

impl fmt::Display for HostUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HostUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = crate::providers::redact::Redactor::default().text(&self.0);
        fmt::Debug::fmt(&shown, f)
    }
}

/// Where events, turns and decisions are kept: a SQLite file or Postgres.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_postgres(&self) -> bool {
        self.0.starts_with("postgres")
    }
}

impl FromStr for DatabaseUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if !(s.starts_with("sqlite:")
            || s.starts_with("postgres://")
            || s.starts_with("postgresql://"))
        {
            return Err("must start with sqlite:, postgres:// or postgresql://".to_owned());
        }
        if s.starts_with("sqlite:") && s.contains(":memory:") {
            return Err(
                "an in-memory SQLite database is not supported: the writer and the readers share one file"
                    .to_owned(),
            );
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Shows the URL with its password hidden.
impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

/// Hides the password of a connection URL.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Setting a password only fails for URLs that cannot have one.
            let _ = parsed.set_password(Some("<redacted>"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_and_is_read_only_through_expose() {
        let key = Secret::from("sk-never-shown");
        assert_eq!(format!("{key} {key:?}"), "<redacted> <redacted>");
        assert_eq!(key.expose(), "sk-never-shown");
    }

    #[test]
    fn a_provider_list_is_checked_entry_by_entry() {
        let list: ProviderList = "openai:gpt-4o-mini, anthropic:claude-sonnet-4-6,ollama:llama3.2"
            .parse()
            .unwrap();
        let kinds: Vec<_> = list.0.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                ProviderKind::OpenAi,
                ProviderKind::Anthropic,
                ProviderKind::Ollama
            ]
        );
        assert_eq!(list.0[2].model, "llama3.2");
        for (bad, says) in [
            ("openai", "is not provider:model"),
            ("mystery:x", "unknown provider"),
            ("anthropic:", "names no model"),
            (" , ", "lists no provider"),
        ] {
            let error = bad.parse::<ProviderList>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn urls_print_without_their_secrets() {
        let db: DatabaseUrl = "postgres://u:hunter2@db/x".parse().unwrap();
        assert!(!format!("{db:?}").contains("hunter2"));
        assert_eq!(db.as_str(), "postgres://u:hunter2@db/x");
        let base: HttpUrl = "https://r.example/v1?api-version=1&api-key=qk-secret"
            .parse()
            .unwrap();
        let shown = format!("{base:?}");
        assert!(
            shown.contains("api-version=1&api-key=[redacted]"),
            "{shown}"
        );
        assert!("ftp://x".parse::<HttpUrl>().is_err());
        assert!("sqlite::memory:".parse::<DatabaseUrl>().is_err());
        assert!("mysql://x".parse::<DatabaseUrl>().is_err());
    }
}

#[cfg(test)]
mod resource_attribute_tests {
    use super::ResourceAttributes;

    #[test]
    fn resource_attributes_are_key_value_pairs_percent_decoded() {
        let parsed: ResourceAttributes =
            "deployment.environment=prod, team=a%2Cb,service.version=1.2"
                .parse()
                .unwrap();
        assert_eq!(
            parsed.0,
            vec![
                ("deployment.environment".into(), "prod".into()),
                ("team".into(), "a,b".into()),
                ("service.version".into(), "1.2".into()),
            ]
        );
        assert!("novalue".parse::<ResourceAttributes>().is_err());
        assert!("=x".parse::<ResourceAttributes>().is_err());
    }
}

/// The skills the public A2A agent card declares: a JSON list of
/// `{id, name, description, tags?, examples?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSkills(pub Vec<serde_json::Value>);

impl FromStr for AgentSkills {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let skills: Vec<serde_json::Value> =
            serde_json::from_str(s).map_err(|e| format!("expected a JSON list of skills: {e}"))?;
        if skills.is_empty() {
            return Err("lists no skill".to_owned());
        }
        for (i, skill) in skills.iter().enumerate() {
            let Some(fields) = skill.as_object() else {
                return Err(format!("skill {i} is not an object"));
            };
            for required in ["id", "name", "description"] {
                if fields
                    .get(required)
                    .and_then(serde_json::Value::as_str)
                    .is_none_or(|v| v.trim().is_empty())
                {
                    return Err(format!("skill {i} needs a `{required}` (text)"));
                }
            }
            for list in ["tags", "examples"] {
                if fields.get(list).is_some_and(|v| {
                    !v.as_array()
                        .is_some_and(|items| items.iter().all(serde_json::Value::is_string))
                }) {
                    return Err(format!("skill {i}: `{list}` must be a list of text"));
                }
            }
            if let Some(other) = fields
                .keys()
                .find(|k| !["id", "name", "description", "tags", "examples"].contains(&k.as_str()))
            {
                return Err(format!("skill {i}: unknown field `{other}`"));
            }
        }
        Ok(Self(skills))
    }
}
