//! Stage 0-3: memory and context pack, preferences merged, the seven-part
//! message order, hashes.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use harness_base::{
    events::TurnEvent,
    providers::{ChatMessage, scripted::text},
};
use harness_core::{
    harness::{
        hooks::{HookError, MemoryContext, MemoryRetriever},
        prepare::{
            MEMORY_INTRO, SKILL_INTRO, canonical_json, runtime_metadata, short_hash,
            stable_render_hash, untrusted_block, untrusted_context_block,
        },
        thinking::ThinkLevel,
    },
    tools::ToolOutput,
};
use serde_json::json;

use crate::helpers::{Fixed, builder, options, request, run, scripted};

struct Memory;

#[async_trait]
impl MemoryRetriever for Memory {
    async fn retrieve_for_context(&self, _: &str, query: &str) -> Result<MemoryContext, HookError> {
        assert_eq!(query, "Plan my Paris trip");
        Ok(MemoryContext {
            text: "User prefers bullet points.".into(),
            preferences: vec!["bullets".into(), "metric units".into()],
        })
    }
}

fn render(messages: &[ChatMessage]) -> String {
    messages
        .iter()
        .map(|m| format!("[{}] {}", m.role.as_str(), m.content))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test]
async fn the_prompt_has_the_seven_parts_in_the_seeds_order() {
    let provider = scripted([text("Here is your plan.")]);
    let pack = Fixed::ok(
        "get_context_pack",
        ToolOutput::text(
            json!({
                "relevant_facts": [{"anchor": "notes/paris.md", "text": "Paris is in France."}],
                "preferences": ["metric units"]
            })
            .to_string(),
        ),
    );
    let harness = builder(&provider, vec![pack])
        .options(harness_core::harness::HarnessOptions {
            system_prompt: "You are SecondBrain.".into(),
            think_level: ThinkLevel::Low,
            ..options()
        })
        .memory_retriever(Arc::new(Memory))
        .build();
    let mut req = request("Plan my Paris trip");
    req.history = vec![
        ChatMessage::user("Hello"),
        ChatMessage::assistant("Hi!", vec![]),
    ];
    Arc::make_mut(&mut req.asked).skill_context =
        Some("You are acting as a travel planner.".into());
    let ran = run(&harness, req).await;
    assert_eq!(ran.text(), "Here is your plan.");

    let today = Utc::now().date_naive();
    let merged = json!({
        "relevant_facts": [{"anchor": "notes/paris.md", "text": "Paris is in France."}],
        "preferences": ["metric units", "bullets"]
    });
    let system = "You are SecondBrain.\n\n## Thinking Instructions\n\
                  Think briefly before answering. Prefer a direct answer.";
    let expected = [
        format!("[system] {system}"),
        format!(
            "[system] {}",
            runtime_metadata("s-1", "scripted", "scripted-model", today)
        ),
        // Memories and a skill's context are data, fenced like the pack:
        // only the operator's prompt and the metadata are trusted.
        format!(
            "[system] {}",
            untrusted_block(MEMORY_INTRO, "User prefers bullet points.")
        ),
        "[user] Hello".to_owned(),
        "[assistant] Hi!".to_owned(),
        format!("[system] {}", untrusted_context_block(&merged)),
        format!(
            "[system] {}",
            untrusted_block(SKILL_INTRO, "You are acting as a travel planner.")
        ),
        "[user] Plan my Paris trip".to_owned(),
    ]
    .join("\n---\n");
    assert_eq!(render(&provider.requests()[0].messages), expected);

    // The hashes of the preparation reach the decision record.
    let decision = ran
        .sink
        .events()
        .into_iter()
        .find_map(|e| match e {
            TurnEvent::Decision { record, .. } => Some(record),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        decision["context_hash"],
        short_hash(&canonical_json(&merged))
    );
    assert_eq!(decision["prompt_render_hash"], stable_render_hash(system));
    assert_eq!(ran.state.prompt_render_hash(), stable_render_hash(system));
    let output = ran.output.unwrap();
    assert_eq!(output.result.context_pack_json, Some(merged));
}

#[tokio::test]
async fn empty_memory_and_no_skill_leave_their_messages_out() {
    let provider = scripted([text("ok")]);
    let harness = builder(&provider, vec![]).build();
    run(&harness, request("hi")).await;
    let roles: Vec<&str> = provider.requests()[0]
        .messages
        .iter()
        .map(|m| m.role.as_str())
        .collect();
    // System prompt, runtime metadata, the (empty) context pack, the message.
    assert_eq!(roles, ["system", "system", "system", "user"]);
    let pack = &provider.requests()[0].messages[2].content;
    assert!(pack.contains("\"relevant_facts\": []"), "{pack}");
}

#[tokio::test]
async fn runtime_provider_and_model_override_the_metadata_and_the_call() {
    let provider = scripted([text("ok")]);
    let harness = builder(&provider, vec![]).build();
    let mut req = request("hi");
    Arc::make_mut(&mut req.asked).runtime_model = Some("other-model".into());
    run(&harness, req).await;
    let sent = &provider.requests()[0];
    assert_eq!(sent.model, "other-model");
    assert!(
        sent.messages[1]
            .content
            .contains("- provider: scripted\n- model: other-model\n")
    );
}

#[tokio::test]
async fn a_prompt_id_records_a_prompt_rendered_event() {
    let provider = scripted([text("ok")]);
    let harness = builder(&provider, vec![])
        .options(harness_core::harness::HarnessOptions {
            prompt_id: Some("agent.profile.default".into()),
            prompt_version: Some("1.0.0".into()),
            ..options()
        })
        .build();
    let ran = run(&harness, request("hi")).await;
    let rendered: Vec<_> = ran
        .sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TurnEvent::PromptRendered {
                prompt_id,
                prompt_version,
                render_hash,
                ..
            } => Some((prompt_id, prompt_version, render_hash)),
            _ => None,
        })
        .collect();
    assert_eq!(
        rendered,
        [(
            "agent.profile.default".to_owned(),
            Some("1.0.0".to_owned()),
            stable_render_hash(harness_core::harness::DEFAULT_SYSTEM_PROMPT)
        )]
    );
    let provider = scripted([text("ok")]);
    let ran = run(&builder(&provider, vec![]).build(), request("hi")).await;
    assert!(!ran.sink.types().contains(&"prompt.rendered"));
}

#[tokio::test]
async fn semantic_selection_offers_only_the_most_related_tools() {
    use harness_core::tools::Tool;
    let mut tools: Vec<Arc<dyn Tool>> = (0..29)
        .map(|i| Fixed::ok(&format!("filler_{i}"), ToolOutput::text("x")) as Arc<dyn Tool>)
        .collect();
    tools.push(Fixed::ok("weather_forecast", ToolOutput::text("sunny")));
    let provider = scripted([text("ok"), text("ok")]);
    let harness = builder(&provider, tools.clone())
        .options(harness_core::harness::HarnessOptions {
            enable_semantic_selection: true,
            max_tools_per_turn: 5,
            ..options()
        })
        .build();
    run(&harness, request("What is the weather forecast for Paris?")).await;
    let offered: Vec<String> = provider.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(offered.len(), 5);
    assert!(
        offered.contains(&"weather_forecast".to_owned()),
        "{offered:?}"
    );
    // Off by default: every tool is offered.
    let provider = scripted([text("ok")]);
    run(
        &builder(&provider, tools).build(),
        request("weather forecast"),
    )
    .await;
    assert_eq!(provider.requests()[0].tools.len(), 30);
}

#[tokio::test]
async fn without_streaming_no_deltas_are_emitted_but_the_text_is_whole() {
    let provider = scripted([text("one two three")]);
    let harness = builder(&provider, vec![])
        .options(harness_core::harness::HarnessOptions {
            stream: false,
            prompt_tags: vec!["chat".into()],
            ..options()
        })
        .build();
    let ran = run(&harness, request("hi")).await;
    assert!(!ran.sink.types().contains(&"message.delta"));
    let output = ran.output.unwrap();
    assert_eq!(output.result.text, "one two three");
    let record: serde_json::Value = serde_json::from_str(&output.decision.unwrap().record).unwrap();
    assert_eq!(record["prompt_tags"], json!(["chat"]));
    assert_eq!(record["prompt_engine"], "minimal");
}

/// Collects the string fields recorded on spans.
#[derive(Clone, Default)]
struct Recorded(Arc<std::sync::Mutex<Vec<(String, String)>>>);

struct Visitor(Recorded);

impl tracing::field::Visit for Visitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        (self.0)
            .0
            .lock()
            .unwrap()
            .push((field.name().to_owned(), value.to_owned()));
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        values.record(&mut Visitor(self.clone()));
    }
}

#[tokio::test]
async fn prompt_text_reaches_spans_only_when_asked() {
    use tracing_subscriber::layer::SubscriberExt;
    for capture in [false, true] {
        let recorded = Recorded::default();
        let _guard = crate::capture::capture(tracing_subscriber::registry().with(recorded.clone()));
        let provider = scripted([text("secret answer")]);
        let harness = builder(&provider, vec![])
            .options(harness_core::harness::HarnessOptions {
                capture_content: capture,
                ..options()
            })
            .build();
        run(&harness, request("secret question")).await;
        let fields = recorded.0.lock().unwrap().clone();
        let input = fields
            .iter()
            .find(|(name, _)| name == "gen_ai.input.messages");
        let output = fields
            .iter()
            .find(|(name, _)| name == "gen_ai.output.messages");
        if capture {
            assert!(
                input.is_some_and(|(_, v)| v.contains("secret question")),
                "{fields:?}"
            );
            assert_eq!(output.map(|(_, v)| v.as_str()), Some("secret answer"));
        } else {
            assert!(input.is_none() && output.is_none(), "{fields:?}");
            assert!(!format!("{fields:?}").contains("secret"));
        }
    }
}

/// An embedder of bags of words (256 hashed dimensions), `automobile`
/// and `vehicle` on `car`'s; it counts the texts it was asked for.
#[derive(Default)]
struct WordVectors {
    embedded: std::sync::Mutex<Vec<String>>,
}

#[async_trait]
impl harness_base::providers::embeddings::Embedder for WordVectors {
    fn model_id(&self) -> &str {
        "test:words"
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        self.embedded.lock().unwrap().extend(texts.iter().cloned());
        Ok(texts
            .iter()
            .map(|text| {
                let mut vector = vec![0.0f32; 256];
                for word in text
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| w.len() > 2)
                    .map(str::to_lowercase)
                {
                    let word = match word.as_str() {
                        "automobile" | "vehicle" => "car".to_owned(),
                        _ => word,
                    };
                    let hash = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                    });
                    vector[(hash % 256) as usize] += 1.0;
                }
                vector
            })
            .collect())
    }
}

fn offered(provider: &harness_base::providers::scripted::ScriptedProvider) -> Vec<String> {
    provider.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

/// With an embedder, tools are chosen by meaning: no word of the message
/// ("automobile", "insured") is in `car_insurance`, but its meaning is.
/// Each tool is embedded once: the next turn embeds only its message.
/// (Before, selection was by shared words, every score was 0, and the
/// last-registered tool was the one left out.)
#[tokio::test]
async fn with_embeddings_tools_are_chosen_by_meaning_and_embedded_once() {
    use harness_core::tools::Tool;
    let mut tools: Vec<Arc<dyn Tool>> = (0..29)
        .map(|i| Fixed::ok(&format!("filler_{i}"), ToolOutput::text("x")) as Arc<dyn Tool>)
        .collect();
    tools.push(Fixed::ok("car_insurance", ToolOutput::text("insured")));
    let embedder = Arc::new(WordVectors::default());
    let provider = scripted([text("ok"), text("ok")]);
    let harness = builder(&provider, tools)
        .options(harness_core::harness::HarnessOptions {
            enable_semantic_selection: true,
            max_tools_per_turn: 5,
            ..options()
        })
        .tool_embedder(embedder.clone())
        .build();
    run(&harness, request("Is my automobile insured?")).await;
    let chosen = offered(&provider);
    assert_eq!(chosen.len(), 5);
    assert!(chosen.contains(&"car_insurance".to_owned()), "{chosen:?}");
    assert_eq!(
        embedder.embedded.lock().unwrap().len(),
        31,
        "30 tools and the message"
    );
    run(&harness, request("And my vehicle?")).await;
    let embedded = embedder.embedded.lock().unwrap().clone();
    assert_eq!(embedded.len(), 32, "only the new message");
    assert_eq!(embedded.last().unwrap(), "And my vehicle?");
}

/// Without an embedder, tools that tie are not cut in registration order:
/// with nothing in common with the message, the last-registered tools
/// (where MCP and HTTP tools are) keep their chance.
#[tokio::test]
async fn ties_do_not_drop_the_last_registered_tools_first() {
    use harness_core::tools::Tool;
    let tools: Vec<Arc<dyn Tool>> = (0..10)
        .map(|i| Fixed::ok(&format!("t{i}"), ToolOutput::text("x")) as Arc<dyn Tool>)
        .collect();
    let provider = scripted([text("ok")]);
    let harness = builder(&provider, tools)
        .options(harness_core::harness::HarnessOptions {
            enable_semantic_selection: true,
            max_tools_per_turn: 5,
            ..options()
        })
        .build();
    run(&harness, request("Hello there")).await;
    let chosen = offered(&provider);
    assert_eq!(chosen.len(), 5);
    let first_five: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    assert_ne!(chosen, first_five, "ties kept registration order");
}
