//! The service's parts, built from the settings: the provider chain, the
//! harness with its tools, the background worker, the vaults.

use std::{sync::Arc, time::Duration};

use super::{
    StartupError,
    adapters::{
        StoreApprovals, StoreArtifacts, StoreClientResults, StoreSteering, VaultCheckpoints,
    },
};
use crate::{
    background::{
        jobs::{BackgroundWorker, SideCallLimits, WorkerConfig},
        judges::{JudgeList, JudgePanel},
        learner::StoreLearner,
        memory::{QueuedExtraction, StoreMemory},
    },
    config::{EmbeddingModel, ProviderKind, ProviderRef, Settings},
    harness::hooks::AgentCallbacks,
    harness::{AgentHarness, HarnessOptions, compaction::ContextWarningTracker},
    providers::{
        LlmProvider, ProviderError,
        anthropic::{AnthropicConfig, AnthropicProvider},
        chain::{ProviderChain, RetryPolicy},
        demo::DemoProvider,
        embeddings::{EmbeddingsApi, HttpEmbedder},
        ollama::{OllamaConfig, OllamaProvider},
        openai::{OpenAiConfig, OpenAiProvider},
    },
    store::{self},
    tools::{
        Tool, ToolRegistry,
        http_tool::HttpTool,
        notes::{ReadNote, WriteNote},
        retrieval::{GetContextPack, LocalSearch},
        web::{FetchUrl, WebSearch},
    },
    vault::{Vault, Vaults},
};

/// The provider chain of the settings (already validated).
pub fn build_provider(settings: &Settings) -> Result<Arc<dyn LlmProvider>, ProviderError> {
    let connect_timeout = Duration::from_secs(settings.providers.connect_timeout_s);
    let idle_timeout = Duration::from_secs(settings.providers.idle_timeout_s);
    let max_response_bytes = settings.providers.max_response_bytes;
    let chain = settings.provider_chain();
    let mut entries: Vec<Arc<dyn LlmProvider>> = Vec::with_capacity(chain.len());
    for ProviderRef { kind, model } in chain {
        let provider: Arc<dyn LlmProvider> = match kind {
            ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(AnthropicConfig {
                base_url: settings.providers.anthropic_base_url.to_string(),
                api_key: settings
                    .providers
                    .anthropic_api_key
                    .as_ref()
                    .map(|k| k.expose().to_owned()),
                model,
                max_tokens: settings.providers.anthropic_max_tokens,
                connect_timeout,
                idle_timeout,
                max_response_bytes,
            })?),
            ProviderKind::Demo => Arc::new(DemoProvider::new(&model)),
            ProviderKind::Ollama => Arc::new(OllamaProvider::new(OllamaConfig {
                host: settings.providers.ollama_host.as_str().to_owned(),
                model,
                connect_timeout,
                idle_timeout,
                max_response_bytes,
            })?),
            ProviderKind::OpenAi => Arc::new(OpenAiProvider::new(OpenAiConfig {
                base_url: settings.providers.openai_base_url.to_string(),
                api_key: settings
                    .providers
                    .openai_api_key
                    .as_ref()
                    .map(|k| k.expose().to_owned()),
                model,
                connect_timeout,
                idle_timeout,
                max_response_bytes,
            })?),
        };
        entries.push(provider);
    }
    Ok(Arc::new(ProviderChain::new(
        entries,
        retry_policy(settings),
    )?))
}

/// The retry policy of the settings.
pub fn retry_policy(settings: &Settings) -> RetryPolicy {
    RetryPolicy {
        max_attempts: settings.providers.max_attempts,
        base_delay: Duration::from_millis(settings.providers.retry_base_ms),
        max_delay: Duration::from_millis(settings.providers.retry_max_ms),
    }
}

/// The provider names a turn may ask for.
pub(super) fn provider_names(settings: &Settings) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for provider in settings.provider_chain() {
        let name = provider.kind.name().to_owned();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The harness of the service: the built-in tools over the store, the
/// options from the settings (already validated).
pub fn build_harness(
    settings: &Settings,
    store: Arc<dyn store::Store>,
    vaults: Arc<Vaults>,
    provider: Arc<dyn LlmProvider>,
    extra_tools: Vec<Arc<dyn Tool>>,
    approvals: Arc<tokio::sync::Notify>,
    callbacks: Arc<dyn AgentCallbacks>,
) -> AgentHarness {
    let tools = builtin_tools(settings, &store, &vaults);
    let vault = vaults.default_vault();
    let tools = extra_tools.into_iter().fold(tools, ToolRegistry::register);
    let options = harness_options(settings);
    let models = Arc::new(settings.model_catalogue());
    let mut builder = AgentHarness::builder(provider)
        .tools(tools)
        .options(options)
        .context_tracker(Some(ContextWarningTracker::for_models(models.clone())))
        .models(models.clone())
        .artifacts(Arc::new(StoreArtifacts(store.clone())))
        .checkpoint_store(Arc::new(VaultCheckpoints {
            vaults: vaults.clone(),
            store: store.clone(),
        }))
        .cost_tracker(models)
        .callbacks(callbacks)
        .approvals(Arc::new(StoreApprovals {
            store: store.clone(),
            decided: approvals.clone(),
        }))
        .client_results(Arc::new(StoreClientResults {
            store: store.clone(),
            posted: approvals,
        }))
        .steering(Arc::new(StoreSteering(store.clone())));
    if let Some(embedder) = vault.embedder() {
        builder = builder.tool_embedder(embedder);
    }
    let memory = &settings.memory;
    if memory.retrieval {
        builder = builder.memory_retriever(Arc::new(StoreMemory::new(
            store.clone(),
            vault.embedder(),
            memory.top_k,
        )));
    }
    if memory.extraction {
        builder = builder.memory_extractor(Arc::new(QueuedExtraction));
    }
    if memory.research_learner {
        builder = builder.research_learner(Arc::new(StoreLearner {
            redact: settings.telemetry.redact_logs,
        }));
    }
    if let Some(JudgeList(judges)) = &settings.judges.list
        && settings.judges.enabled
        && !judges.is_empty()
    {
        builder = builder.judges(Arc::new(JudgePanel::new(
            judges.clone(),
            settings.telemetry.redact_logs,
        )));
    }
    builder.build()
}

/// The service's own tools: the vault's, and the web's where they can
/// be made (one that cannot is logged and left out).
fn builtin_tools(
    settings: &Settings,
    store: &Arc<dyn store::Store>,
    vaults: &Arc<Vaults>,
) -> ToolRegistry {
    let tools = ToolRegistry::new(settings.harness.tool_permission)
        .register(Arc::new(GetContextPack::new(vaults.clone())))
        .register(Arc::new(LocalSearch::new(store.clone(), vaults.clone())))
        .register(Arc::new(ReadNote::new(vaults.clone())))
        .register(Arc::new(WriteNote::replace(vaults.clone())))
        .register(Arc::new(WriteNote::append(vaults.clone())));
    let web = settings.web.config();
    let tools = match &web.search_url {
        Some(url) => match WebSearch::new(url, web.timeout) {
            Ok(search) => tools.register(Arc::new(search)),
            Err(e) => {
                tracing::error!(error = %e, "web_search is unavailable");
                tools
            }
        },
        None => tools,
    };
    match FetchUrl::new(&web, store.clone()) {
        Ok(fetch) => tools.register(Arc::new(fetch)),
        Err(e) => {
            tracing::error!(error = %e, "fetch_url is unavailable");
            tools
        }
    }
}

/// The harness's options, from the settings.
fn harness_options(settings: &Settings) -> HarnessOptions {
    HarnessOptions {
        max_steps: settings.harness.max_steps,
        timeout: settings.harness.turn_timeout(),
        max_tool_calls: settings.harness.max_tool_calls,
        max_reflections: settings.harness.max_reflections,
        think_level: settings.harness.think_level,
        reasoning: settings.harness.reasoning,
        max_think_level: settings.harness.max_think_level,
        max_output_tokens: settings.harness.max_output_tokens,
        reflect_every: settings.harness.reflect_every,
        system_prompt: settings.harness.system_prompt.clone(),
        prompt_id: settings.harness.prompt_id.clone(),
        prompt_version: settings.harness.prompt_version.clone(),
        redact_logs: settings.telemetry.redact_logs,
        capture_content: settings.telemetry.capture_content && !settings.telemetry.redact_logs,
        parallel_enabled: settings.harness.parallel_tools,
        enable_tool_validation: settings.harness.tool_validation,
        enable_semantic_selection: settings.harness.semantic_tool_selection,
        max_tools_per_turn: settings.harness.max_tools_per_turn,
        auto_compact: settings.harness.auto_compact,
        record_decisions: settings.harness.record_decisions,
        approval_effects: settings
            .harness
            .approval_required
            .as_ref()
            .map(|list| list.0.clone())
            .unwrap_or_default(),
        wait_timeout: settings.harness.approval_timeout.0,
        park_after: Some(settings.harness.park_after.0),
        ..HarnessOptions::default()
    }
}

/// The worker that runs memory extraction and judges after turns.
pub fn build_worker(
    settings: &Settings,
    store: Arc<dyn store::Store>,
    provider: Arc<dyn LlmProvider>,
    embedder: Option<Arc<dyn crate::providers::embeddings::Embedder>>,
    jobs: Arc<tokio::sync::Notify>,
) -> BackgroundWorker {
    let config = WorkerConfig {
        extraction: settings.memory.extraction.then_some(SideCallLimits {
            timeout: Duration::from_secs(settings.memory.timeout_s),
            max_output_tokens: settings.memory.max_output_tokens,
        }),
        judges: settings
            .judges
            .list
            .as_ref()
            .map(|list| list.0.clone())
            .unwrap_or_default(),
        judging: settings.judges.enabled.then_some(SideCallLimits {
            timeout: Duration::from_secs(settings.judges.timeout_s),
            max_output_tokens: settings.judges.max_output_tokens,
        }),
        redact: settings.telemetry.redact_logs,
        concurrency: settings.memory.job_concurrency as usize,
        backlog_max: settings.memory.job_backlog_max,
        images: crate::background::images::JobImages {
            memory: settings.memory.images,
            judges: settings.judges.images,
        },
    };
    BackgroundWorker::new(
        store,
        provider,
        Arc::new(settings.model_catalogue()),
        embedder,
        config,
        jobs,
    )
}

/// The vault of the settings, with its embedder when one is configured.
pub fn build_vault(
    settings: &Settings,
    store: Arc<dyn store::Store>,
) -> Result<Vault, StartupError> {
    let vault = Vault::new(settings.vault.dir.clone(), store);
    let Some(EmbeddingModel(model)) = &settings.vault.embeddings else {
        return Ok(vault);
    };
    let (api, base, key) = match model.kind {
        ProviderKind::Ollama => (
            EmbeddingsApi::Ollama,
            settings.providers.ollama_host.as_str().to_owned(),
            None,
        ),
        _ => (
            EmbeddingsApi::OpenAi,
            settings.providers.openai_base_url.to_string(),
            settings
                .providers
                .openai_api_key
                .as_ref()
                .map(|k| k.expose().to_owned()),
        ),
    };
    let embedder =
        HttpEmbedder::new(api, &base, key, &model.model).map_err(|reason| StartupError::Tool {
            name: "vault embeddings".into(),
            reason,
        })?;
    Ok(vault.with_embedder(Arc::new(embedder)))
}

/// The tools the settings declare (HTTP APIs); their header variables are
/// read from `env` now, and a tool may not take a built-in tool's name.
pub fn declared_tools(
    settings: &Settings,
    env: impl Fn(&str) -> Option<String> + Copy,
) -> Result<Vec<Arc<dyn Tool>>, StartupError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for config in settings.tools.http.iter().flat_map(|list| list.0.iter()) {
        let refuse = |reason: String| StartupError::Tool {
            name: config.name.clone(),
            reason,
        };
        if crate::tools::BUILTIN_TOOLS.contains(&config.name.as_str()) {
            return Err(refuse("a built-in tool has this name".into()));
        }
        tools.push(Arc::new(HttpTool::new(config, env).map_err(refuse)?));
    }
    Ok(tools)
}
