use std::{collections::HashMap, time::Duration};

use super::*;
use crate::{providers::ThinkLevel, tools::PermissionMode};

fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    load_with(&[], env)
}

fn load_with(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let argv = std::iter::once("agent-harness").chain(args.iter().copied());
    Settings::load_from(argv, |name| map.get(name).cloned())
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("harness.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_str().unwrap().to_owned())
}

#[test]
fn the_defaults_are_valid_and_local() {
    let s = load(&[]).unwrap();
    assert_eq!(s.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(s.database.url.as_str(), "sqlite://./data/agent-harness.db");
    assert_eq!(s.server.body_limit_bytes, 1024 * 1024);
    assert_eq!(s.harness.max_steps, 6);
    assert_eq!(s.harness.turn_timeout_s, 60);
    assert_eq!(s.harness.think_level, ThinkLevel::Off);
    assert_eq!(s.harness.tool_permission, PermissionMode::Auto);
    assert!(s.harness.parallel_tools && s.harness.auto_compact);
    assert_eq!(s.server.cors_origins, None);
    assert_eq!(
        s.provider_chain(),
        [ProviderRef {
            kind: ProviderKind::OpenAi,
            model: "gpt-4o-mini".to_owned()
        }]
    );
    assert_eq!(
        s.harness.system_prompt,
        crate::harness::DEFAULT_SYSTEM_PROMPT
    );
    // `Default` is the same thing.
    assert_eq!(format!("{:?}", Settings::default()), format!("{s:?}"));
}

/// Memory extraction costs a model call per turn: off unless asked for,
/// with one setting. (The seeds' default is no extractor.)
#[test]
fn memory_extraction_is_off_until_one_setting_turns_it_on() {
    assert!(!load(&[]).unwrap().memory.extraction);
    let on = load(&[("HARNESS_MEMORY_EXTRACTION", "true")]).unwrap();
    assert!(on.memory.extraction);
}

#[test]
fn values_are_typed_at_load() {
    let s = load(&[
        ("HARNESS_THINK_LEVEL", "Medium"),
        ("HARNESS_TOOL_PERMISSION", "read_only"),
        ("HARNESS_PARALLEL_TOOLS", "off"),
        ("HARNESS_LOG_FORMAT", "json"),
        (
            "HARNESS_CORS_ORIGINS",
            "https://a.example, http://b.example:8080",
        ),
        (
            "HARNESS_PROVIDERS",
            "anthropic:claude-sonnet-4-6,ollama:llama3.2",
        ),
        ("HARNESS_STALE_TURN_AFTER_S", "9"),
    ])
    .unwrap();
    assert_eq!(s.harness.think_level, ThinkLevel::Medium);
    assert_eq!(s.harness.tool_permission, PermissionMode::ReadOnly);
    assert!(!s.harness.parallel_tools);
    assert_eq!(s.telemetry.log_format, LogFormat::Json);
    assert_eq!(
        s.server.cors_origins,
        Some(CorsOrigins::List(vec![
            "https://a.example".to_owned(),
            "http://b.example:8080".to_owned()
        ]))
    );
    let kinds: Vec<_> = s.provider_chain().iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [ProviderKind::Anthropic, ProviderKind::Ollama]);
    assert_eq!(s.server.stale_turn_after(), Duration::from_secs(9));
}

#[test]
fn the_command_line_beats_the_environment_which_beats_the_file() {
    let (_dir, path) =
        file("[providers]\nmodel = \"from-file\"\n[harness]\nmax_steps = 3\nturn_timeout_s = 7\n");
    let env = [
        ("HARNESS_CONFIG", path.as_str()),
        ("HARNESS_MODEL", "from-env"),
        ("HARNESS_TURN_TIMEOUT_S", "8"),
    ];
    let s = load(&env).unwrap();
    assert_eq!(s.providers.model, "from-env");
    assert_eq!(s.harness.max_steps, 3);
    assert_eq!(s.harness.turn_timeout_s, 8);
    assert_eq!(s.config_file.as_deref(), Some(std::path::Path::new(&path)));
    let s = load_with(&["--turn-timeout-s", "9", "--model=from-flag"], &env).unwrap();
    assert_eq!(s.harness.turn_timeout_s, 9);
    assert_eq!(s.providers.model, "from-flag");
    assert_eq!(s.harness.max_steps, 3);
    // `--config` names the file as well as the variable does.
    let s = load_with(&["--config", &path], &[]).unwrap();
    assert_eq!(s.providers.model, "from-file");
}

#[test]
fn an_empty_value_counts_as_unset() {
    let s = load(&[
        ("HARNESS_MODEL", ""),
        ("OPENAI_API_KEY", "  "),
        ("HARNESS_CORS_ORIGINS", ""),
        ("HARNESS_MAX_STEPS", ""),
    ])
    .unwrap();
    assert_eq!(s.providers.model, "gpt-4o-mini");
    assert!(s.providers.openai_api_key.is_none());
    assert!(s.server.cors_origins.is_none());
    assert_eq!(s.harness.max_steps, 6);
}

#[test]
fn a_bad_value_names_its_variable() {
    for (name, value) in [
        ("HARNESS_LISTEN", "not-an-address"),
        ("DATABASE_URL", "mysql://x"),
        ("DATABASE_URL", "sqlite::memory:"),
        ("HARNESS_MAX_STEPS", "0"),
        ("HARNESS_MAX_STEPS", "many"),
        ("OPENAI_BASE_URL", "ftp://x"),
        ("HARNESS_THINK_LEVEL", "extreme"),
        ("HARNESS_TOOL_PERMISSION", "some"),
        ("HARNESS_PARALLEL_TOOLS", "perhaps"),
        ("HARNESS_LOG_FORMAT", "xml"),
        ("HARNESS_PROVIDERS", "mystery:x"),
        ("HARNESS_PROVIDERS", "anthropic:"),
        ("HARNESS_CORS_ORIGINS", "https://a.example/"),
        ("HARNESS_CORS_ORIGINS", "*,https://b.example"),
        ("HARNESS_PRICING", r#"{"m": {"input": -1, "output": 1}}"#),
        ("HARNESS_PRICING", "cheap"),
        ("HARNESS_LOG", "=info=x"),
        ("HARNESS_STALE_TURN_AFTER_S", "5"),
        ("HARNESS_VAULT_EMBEDDINGS", "anthropic:claude-sonnet-4-6"),
        ("HARNESS_VAULT_EMBEDDINGS", "openai:a,ollama:b"),
        ("HARNESS_WEB_ALLOW", "not a host!"),
        ("HARNESS_WEB_FETCH_MAX_BYTES", "10"),
        ("HARNESS_WORKER_THREADS", "0"),
        ("HARNESS_EVENT_LINGER_MS", "101"),
    ] {
        let err = load(&[(name, value)]).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("{name}: ")),
            "{name}={value}: {err}"
        );
    }
    let err = load(&[("RUST_LOG", "=info=x")]).unwrap_err();
    assert!(err.to_string().starts_with("HARNESS_LOG: "), "{err}");
}

#[test]
fn a_bad_value_from_a_flag_or_the_file_names_the_flag_or_the_key() {
    let err = load_with(&["--max-steps", "lots"], &[("HARNESS_MAX_STEPS", "4")]).unwrap_err();
    assert!(err.to_string().starts_with("--max-steps: "), "{err}");
    let (_dir, path) = file("[harness]\nthink_level = \"extreme\"\n");
    let err = load(&[("HARNESS_CONFIG", &path)]).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("harness.think_level in {path}: ")),
        "{shown}"
    );
    assert!(shown.contains("unknown think level"), "{shown}");
}

#[test]
fn the_file_is_in_sections_and_refuses_what_it_does_not_know() {
    for (text, says) in [
        (
            "[harness]\nmodle = \"typo\"\n",
            "harness.modle: no such setting",
        ),
        ("model = \"flat\"\n", "model: settings belong in a section"),
        ("[serve]\nlisten = \"x\"\n", "serve: no such section"),
    ] {
        let (_dir, path) = file(text);
        let err = load(&[("HARNESS_CONFIG", &path)]).unwrap_err();
        assert!(err.to_string().contains(says), "{text}: {err}");
    }
    let (_dir, path) = file(
        "[server]\ncors_origins = [\"https://a.example\", \"https://b.example\"]\n\
         [providers]\nchain = \"openai:gpt-4.1\"\n\
         [providers.pricing]\n\"gpt-4.1\" = { input = 2.0, output = 8.0 }\n\
         [telemetry]\nredact_logs = true\n",
    );
    let s = load(&[("HARNESS_CONFIG", &path)]).unwrap();
    assert!(matches!(&s.server.cors_origins, Some(CorsOrigins::List(l)) if l.len() == 2));
    assert_eq!(s.provider_chain()[0].model, "gpt-4.1");
    assert_eq!(s.providers.pricing.0["gpt-4.1"].output, 8.0);
    assert!(s.telemetry.redact_logs);
}

#[test]
fn a_settings_variable_is_its_flag_after_harness_unless_it_is_a_standard_one() {
    let standard = [
        "DATABASE_URL",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "OLLAMA_HOST",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
    ];
    let mut named = Vec::new();
    for arg in Settings::command().get_arguments() {
        let long = arg.get_long().unwrap();
        let env = arg.get_env().and_then(|e| e.to_str()).unwrap().to_owned();
        let derived = format!("HARNESS_{}", long.to_uppercase().replace('-', "_"));
        if env != derived {
            named.push(env);
        }
    }
    assert_eq!(named, standard);
    // A variable named by the rule alone sets its setting.
    let s = load(&[
        ("HARNESS_PROVIDER_MAX_ATTEMPTS", "5"),
        ("HARNESS_WEB_ALLOW", "10.0.0.0/8"),
    ])
    .unwrap();
    assert_eq!(s.providers.max_attempts, 5);
    assert!(s.web.allow.is_some());
}

#[test]
fn help_lists_every_setting_with_its_variable() {
    let err = load_with(&["--help"], &[]).unwrap_err();
    let ConfigError::Cli(help) = err else {
        panic!("expected help, got {err}");
    };
    let help = help.to_string();
    let command = Settings::command();
    let mut settings = 0;
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let env = arg.get_env().and_then(|e| e.to_str());
        let env = env.unwrap_or_else(|| panic!("{id} has no variable"));
        assert!(
            help.contains(&format!("[env: {env}")),
            "{env} missing:\n{help}"
        );
        let long = arg.get_long().unwrap();
        assert!(help.contains(&format!("--{long} ")), "--{long} missing");
        settings += 1;
    }
    assert!(settings > 50, "{settings}");
    for heading in [
        "Server:",
        "Database:",
        "Providers:",
        "Harness:",
        "Telemetry:",
    ] {
        assert!(help.contains(heading), "{heading} missing");
    }
}

#[test]
fn secrets_never_print() {
    let s = load(&[
        ("OPENAI_API_KEY", " sk-secret "),
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ("DATABASE_URL", "postgres://u:hunter2@db/x"),
        ("HARNESS_WEBHOOK_URL", "https://hooks.example.com/in"),
        (
            "HARNESS_WEBHOOK_SECRET",
            "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1vcGVyYXRvcg==",
        ),
        (
            "OPENAI_BASE_URL",
            "https://r.openai.azure.com/openai/deployments/d?api-version=1&api-key=qk-secret",
        ),
    ])
    .unwrap();
    assert_eq!(
        s.providers.openai_api_key.as_ref().map(Secret::expose),
        Some("sk-secret")
    );
    let shown = format!("{s:?}");
    assert_eq!(
        s.server.webhook_secret.as_ref().map(Secret::expose),
        Some("whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1vcGVyYXRvcg==")
    );
    for secret in [
        "sk-secret",
        "sk-ant-secret",
        "hunter2",
        "qk-secret",
        "c2VjcmV0LXNpZ25pbmcta2V5",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("api-version=1&api-key=[redacted]"),
        "{shown}"
    );
}

#[test]
fn http_tools_are_declared_as_tables_in_the_file_or_json_in_the_environment() {
    let (_dir, path) = file(
        "[[tools.http]]\nname = \"get_item\"\ndescription = \"Read an item.\"\n\
         url = \"https://api.example/items/{id}\"\neffect = \"READ_ONLY\"\n\
         headers = { Authorization = \"Bearer ${ITEMS_TOKEN}\" }\n\
         parameters = { type = \"object\", properties = { id = { type = \"string\" } } }\n\
         [[tools.http]]\nname = \"open_ticket\"\ndescription = \"Open one.\"\nmethod = \"POST\"\n\
         url = \"https://api.example/tickets\"\n",
    );
    let s = load(&[("HARNESS_CONFIG", &path)]).unwrap();
    let tools = &s.tools.http.as_ref().unwrap().0;
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0].effect, crate::tools::EffectClass::ReadOnly);
    assert_eq!(tools[1].method, "POST");
    let s = load(&[(
        "HARNESS_HTTP_TOOLS",
        r#"[{"name": "a", "description": "d", "url": "https://x.example/"}]"#,
    )])
    .unwrap();
    assert_eq!(s.tools.http.unwrap().0[0].name, "a");
    let err = load(&[(
        "HARNESS_HTTP_TOOLS",
        r#"[{"name": "a b", "description": "d", "url": "https://x.example/"}]"#,
    )])
    .unwrap_err();
    assert!(err.to_string().starts_with("HARNESS_HTTP_TOOLS: "), "{err}");
}

#[test]
fn mcp_servers_are_declared_as_tables_in_the_file() {
    let (_dir, path) = file(
        "[[tools.mcp]]\nname = \"files\"\ncommand = \"mcp-files\"\nargs = [\"--root\", \"/srv\"]\n\
         env = { TOKEN = \"${FILES_TOKEN}\" }\n\
         [[tools.mcp]]\nname = \"tickets\"\nurl = \"https://mcp.example/mcp\"\ntimeout_s = 10\n",
    );
    let s = load(&[("HARNESS_CONFIG", &path)]).unwrap();
    let servers = &s.tools.mcp.as_ref().unwrap().0;
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].args, ["--root", "/srv"]);
    assert_eq!(servers[1].url.as_deref(), Some("https://mcp.example/mcp"));
    let (_dir, path) =
        file("[[tools.mcp]]\nname = \"both\"\ncommand = \"x\"\nurl = \"https://x/\"\n");
    let err = load(&[("HARNESS_CONFIG", &path)]).unwrap_err();
    assert!(
        err.to_string().contains("give either a command or a url"),
        "{err}"
    );
}

#[test]
fn approval_effects_are_effect_classes() {
    let s = load(&[("HARNESS_APPROVAL_REQUIRED", "local_write, DESTRUCTIVE")]).unwrap();
    assert_eq!(
        s.harness.approval_required.unwrap().0,
        [
            crate::tools::EffectClass::LocalWrite,
            crate::tools::EffectClass::Destructive
        ]
    );
    let err = load(&[("HARNESS_APPROVAL_REQUIRED", "WRITES")]).unwrap_err();
    assert!(
        err.to_string().starts_with("HARNESS_APPROVAL_REQUIRED: "),
        "{err}"
    );
}

#[test]
fn waits_are_spans_of_time() {
    let s = load(&[]).unwrap();
    assert_eq!(s.harness.approval_timeout.0, Duration::from_secs(24 * 3600));
    assert_eq!(s.harness.park_after.0, Duration::from_secs(10));
    let s = load(&[
        ("HARNESS_APPROVAL_TIMEOUT", "1h30m"),
        ("HARNESS_PARK_AFTER", "250ms"),
    ])
    .unwrap();
    assert_eq!(s.harness.approval_timeout.0, Duration::from_secs(5400));
    assert_eq!(s.harness.park_after.0, Duration::from_millis(250));
    assert_eq!(
        load(&[("HARNESS_PARK_AFTER", "0s")])
            .unwrap()
            .harness
            .park_after
            .0,
        Duration::ZERO
    );
    let s = load(&[("HARNESS_RETENTION", "365d")]).unwrap();
    assert_eq!(
        s.server.retention.map(|r| r.0),
        Some(Duration::from_secs(365 * 86400))
    );
    assert_eq!(
        s.server.retention_sweep_interval.0,
        Duration::from_secs(600)
    );
    assert_eq!(load(&[]).unwrap().server.retention, None);
    for bad in [
        "24",
        "h",
        "3 s",
        "2w",
        "31d",
        "1.5h",
        "-3s",
        "9999999999999s",
    ] {
        let err = load(&[("HARNESS_APPROVAL_TIMEOUT", bad)])
            .map(|s| s.harness.approval_timeout)
            .expect_err(bad);
        assert!(
            err.to_string().starts_with("HARNESS_APPROVAL_TIMEOUT: "),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn auth_is_on_by_default_beyond_loopback() {
    assert!(!load(&[]).unwrap().server.auth_required(), "127.0.0.1");
    assert!(
        load(&[("HARNESS_LISTEN", "0.0.0.0:8080")])
            .unwrap()
            .server
            .auth_required()
    );
    let ipv6_loopback = load(&[("HARNESS_LISTEN", "[::1]:8080")]).unwrap();
    assert!(!ipv6_loopback.server.auth_required());
    let off = load(&[("HARNESS_LISTEN", "0.0.0.0:8080"), ("HARNESS_AUTH", "off")]).unwrap();
    assert!(!off.server.auth_required());
    assert!(
        load(&[("HARNESS_AUTH", "on")])
            .unwrap()
            .server
            .auth_required()
    );
    assert!(load(&[("HARNESS_AUTH", "sometimes")]).is_err());
}

#[test]
fn workers_are_one_a_core_unless_told() {
    let defaults = load(&[]).unwrap();
    assert_eq!(defaults.worker_threads(2), 2);
    assert_eq!(defaults.worker_threads(0), 1);
    let told = load(&[("HARNESS_WORKER_THREADS", "1")]).unwrap();
    assert_eq!(told.worker_threads(2), 1);
    assert_eq!(told.worker_threads(8), 1);
}

#[test]
fn text_waits_two_ms_for_company_by_default() {
    assert_eq!(load(&[]).unwrap().database.event_linger_ms, 2);
    let off = load(&[("HARNESS_EVENT_LINGER_MS", "0")]).unwrap();
    assert_eq!(off.database.event_linger_ms, 0);
}

#[test]
fn a_value_out_of_its_range_names_the_range() {
    for (name, value, reason) in [
        ("HARNESS_MAX_STEPS", "0", "must be between 1 and 100"),
        ("HARNESS_MAX_STEPS", "101", "must be between 1 and 100"),
        (
            "HARNESS_CONTEXT_WINDOW_TOKENS",
            "5",
            "must be at least 1024",
        ),
        ("HARNESS_BODY_LIMIT_BYTES", "0", "must be at least 1"),
        (
            "HARNESS_WORKER_THREADS",
            "1025",
            "must be between 1 and 1024",
        ),
        (
            "HARNESS_EVENT_LINGER_MS",
            "101",
            "must be between 0 and 100",
        ),
    ] {
        let err = load(&[(name, value)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{name}: {reason}"),
            "{name}={value}"
        );
    }
    let (_dir, path) = file("[harness]\nmax_steps = 0\n");
    let err = load_with(&["--config", &path], &[]).unwrap_err();
    assert!(
        err.to_string().ends_with(": must be between 1 and 100"),
        "{err}"
    );
}
