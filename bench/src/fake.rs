//! A fake LLM provider. Its behaviour comes from the model name, so
//! that the same request shape drives it directly and through the harness:
//! `bench/ttft=200/itl=20/n=100/tools=6/toolms=100/cost=25`.
//!
//! - `ttft`: milliseconds before the first token; `itl`: between tokens;
//! - `n`: tokens of text, one per chunk as real servers send them;
//! - `tools`: when the prompt has no tool result yet, answer with this many
//!   `bench_sleep` calls (each `toolms` long, on distinct keys) instead,
//!   their arguments streamed in fragments as real servers do;
//! - `cost`: microseconds of busy work per chunk, so that the fake costs
//!   what a real provider server's stream costs (a Python OpenAI-compatible
//!   server spends about 1.1 ms of CPU on a 40-token stream: `cost=25`).
//!   0, the default, is the fastest fake there can be.

use std::{convert::Infallible, net::SocketAddr, time::Duration};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    http::{StatusCode, Uri, header},
    response::Response,
    routing::{get, post},
    serve::ListenerExt,
};
use serde_json::Value;

/// What one request asks of the fake.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spec {
    pub ttft_ms: u64,
    pub itl_ms: u64,
    pub tokens: u64,
    pub tools: u64,
    pub tool_ms: u64,
    pub cost_us: u64,
}

impl Spec {
    pub fn parse(model: &str) -> Self {
        let mut spec = Self {
            tokens: 20,
            tool_ms: 100,
            ..Self::default()
        };
        for part in model.split('/') {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            let Ok(value) = value.parse::<u64>() else {
                continue;
            };
            match key {
                "ttft" => spec.ttft_ms = value,
                "itl" => spec.itl_ms = value,
                "n" => spec.tokens = value,
                "tools" => spec.tools = value,
                "toolms" => spec.tool_ms = value,
                "cost" => spec.cost_us = value,
                _ => {}
            }
        }
        spec
    }

    /// The model name that asks for this spec.
    pub fn model(&self) -> String {
        format!(
            "bench/ttft={}/itl={}/n={}/tools={}/toolms={}/cost={}",
            self.ttft_ms, self.itl_ms, self.tokens, self.tools, self.tool_ms, self.cost_us
        )
    }

    /// A stream shaped and priced like a real provider's one-step answer:
    /// 40 text chunks, a finish chunk and a usage chunk, at the CPU a real
    /// OpenAI-compatible server spends on them.
    pub fn realistic() -> Self {
        Self {
            tokens: 40,
            cost_us: 25,
            ..Self::parse("bench")
        }
    }
}

/// Every model the bench's scenarios and comparison name: the service
/// offers only the models its operator lists (`[providers.models]`), so
/// the bench lists these.
pub fn offered_models() -> Vec<String> {
    let realistic = Spec::realistic();
    let slow = Spec {
        ttft_ms: 200,
        itl_ms: 20,
        ..realistic
    };
    let tool_step = Spec {
        tools: 1,
        tool_ms: 0,
        ..realistic
    };
    let mut models: Vec<String> = [realistic, slow, tool_step]
        .iter()
        .map(Spec::model)
        .collect();
    models.extend(
        [
            "bench/n=1",
            "bench/n=20",
            "bench/n=40",
            "bench/n=2000",
            "bench/itl=50/n=200",
            "bench/ttft=25/n=20",
            "bench/ttft=60000/n=1",
            "bench/tools=6/toolms=100/n=10",
        ]
        .iter()
        .map(|name| Spec::parse(name).model()),
    );
    models
}

/// Burns `micros` of CPU, as a real server's per-chunk work (tokenising,
/// serialising, framing) does. It spins on the clock, so on a machine
/// whose cores are all busy it costs wall time more than CPU.
fn busy(micros: u64) {
    if micros == 0 {
        return;
    }
    let until = std::time::Instant::now() + Duration::from_micros(micros);
    let mut x = 0u64;
    while std::time::Instant::now() < until {
        for i in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

pub async fn serve(listen: SocketAddr) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("fake provider cannot bind {listen}: {e}"))?;
    serve_on(listener).await
}

/// Serves the fake on `listener`.
pub async fn serve_on(listener: tokio::net::TcpListener) -> Result<(), String> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .fallback(post(answer));
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("fake provider: {e}"))
}

async fn answer(uri: Uri, Json(body): Json<Value>) -> Response {
    let spec = Spec::parse(body["model"].as_str().unwrap_or(""));
    let anthropic = uri.path().ends_with("/messages");
    let has_tool_result = body["messages"].as_array().is_some_and(|messages| {
        messages.iter().any(|m| {
            m["role"] == "tool"
                || m["content"]
                    .as_array()
                    .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
        })
    });
    let calls = if has_tool_result { 0 } else { spec.tools };
    let stream = async_stream::stream! {
        if spec.ttft_ms > 0 {
            tokio::time::sleep(Duration::from_millis(spec.ttft_ms)).await;
        }
        let (frames, first_token) = if anthropic {
            (anthropic_frames(spec, calls), 2)
        } else {
            (openai_frames(spec, calls), 1)
        };
        let paced = first_token + 1..first_token + spec.tokens as usize;
        for (i, frame) in frames.into_iter().enumerate() {
            // The inter-token latency goes between text tokens only.
            if spec.itl_ms > 0 && calls == 0 && paced.contains(&i) {
                tokio::time::sleep(Duration::from_millis(spec.itl_ms)).await;
            }
            busy(spec.cost_us);
            yield Ok::<Bytes, Infallible>(Bytes::from(frame));
        }
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

const OPENAI_HEAD: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1763790000,"model":"bench","system_fingerprint":"fp_bench","choices":["#;

fn openai_chunk(choice: &str, usage: &str) -> String {
    format!("data: {OPENAI_HEAD}{choice}],\"usage\":{usage}}}\n\n")
}

/// The frames of an OpenAI chat-completions stream.
fn openai_frames(spec: Spec, calls: u64) -> Vec<String> {
    let mut frames = vec![openai_chunk(
        r#"{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}"#,
        "null",
    )];
    let finish = if calls > 0 {
        // As real servers stream them: a chunk naming each call with empty
        // arguments, then the arguments in fragments.
        for i in 0..calls {
            frames.push(openai_chunk(
                &format!(
                    r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"id":"call_{i}","type":"function","function":{{"name":"bench_sleep","arguments":""}}}}]}},"finish_reason":null}}"#
                ),
                "null",
            ));
            let arguments = format!(r#"{{\"key\":\"k{i}\",\"ms\":{}}}"#, spec.tool_ms);
            for fragment in fragments(&arguments) {
                frames.push(openai_chunk(
                    &format!(
                        r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"function":{{"arguments":"{fragment}"}}}}]}},"finish_reason":null}}"#
                    ),
                    "null",
                ));
            }
        }
        "tool_calls"
    } else {
        for i in 0..spec.tokens {
            frames.push(openai_chunk(
                &format!(r#"{{"index":0,"delta":{{"content":"tok{i} "}},"finish_reason":null}}"#),
                "null",
            ));
        }
        "stop"
    };
    frames.push(openai_chunk(
        &format!(r#"{{"index":0,"delta":{{}},"finish_reason":"{finish}"}}"#),
        "null",
    ));
    frames.push(format!(
        "data: {OPENAI_HEAD}],\"usage\":{{\"prompt_tokens\":20,\"completion_tokens\":{},\"total_tokens\":{}}}}}\n\n",
        spec.tokens,
        spec.tokens + 20
    ));
    frames.push("data: [DONE]\n\n".to_owned());
    frames
}

/// `escaped` (a JSON string's escaped text) in pieces of about 6
/// characters, never splitting an escape.
fn fragments(escaped: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut chars = escaped.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c == '\\' {
            chars.next();
        }
        let end = chars.peek().map_or(escaped.len(), |(j, _)| *j);
        if end - start >= 6 || end == escaped.len() {
            pieces.push(&escaped[start..end]);
            start = end;
        }
    }
    pieces
}

/// The frames of an Anthropic Messages stream.
fn anthropic_frames(spec: Spec, calls: u64) -> Vec<String> {
    let event = |name: &str, data: String| format!("event: {name}\ndata: {data}\n\n");
    let mut frames = vec![event(
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_bench","type":"message","role":"assistant","model":"bench","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":1}}}"#.to_owned(),
    )];
    let stop = if calls > 0 {
        for i in 0..calls {
            frames.push(event("content_block_start", format!(
                r#"{{"type":"content_block_start","index":{i},"content_block":{{"type":"tool_use","id":"toolu_{i}","name":"bench_sleep","input":{{}}}}}}"#
            )));
            let input = format!(r#"{{\"key\":\"k{i}\",\"ms\":{}}}"#, spec.tool_ms);
            for fragment in fragments(&input) {
                frames.push(event("content_block_delta", format!(
                    r#"{{"type":"content_block_delta","index":{i},"delta":{{"type":"input_json_delta","partial_json":"{fragment}"}}}}"#
                )));
            }
            frames.push(event(
                "content_block_stop",
                format!(r#"{{"type":"content_block_stop","index":{i}}}"#),
            ));
        }
        "tool_use"
    } else {
        frames.push(event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#
                .to_owned(),
        ));
        for i in 0..spec.tokens {
            frames.push(event("content_block_delta", format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"tok{i} "}}}}"#
            )));
        }
        frames.push(event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        ));
        "end_turn"
    };
    frames.push(event(
        "message_delta",
        format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}},"usage":{{"output_tokens":{}}}}}"#, spec.tokens),
    ));
    frames.push(event(
        "message_stop",
        r#"{"type":"message_stop"}"#.to_owned(),
    ));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_round_trips_the_spec() {
        let spec = Spec {
            ttft_ms: 200,
            itl_ms: 20,
            tokens: 100,
            tools: 6,
            tool_ms: 100,
            cost_us: 25,
        };
        assert_eq!(Spec::parse(&spec.model()), spec);
    }

    #[test]
    fn frames_are_valid_streams_of_each_format() {
        let spec = Spec {
            tokens: 3,
            ..Spec::parse("bench")
        };
        let openai = openai_frames(spec, 0);
        assert_eq!(openai.len(), 1 + 3 + 1 + 1 + 1);
        for frame in &openai[..openai.len() - 1] {
            let json = frame.strip_prefix("data: ").unwrap().trim();
            serde_json::from_str::<Value>(json).unwrap();
        }
        // The calls' arguments come in fragments that join into JSON.
        let tools = openai_frames(Spec { tools: 2, ..spec }, 2);
        let mut arguments = [String::new(), String::new()];
        for frame in &tools[..tools.len() - 1] {
            let chunk: Value =
                serde_json::from_str(frame.strip_prefix("data: ").unwrap().trim()).unwrap();
            for call in chunk["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = call["index"].as_u64().unwrap() as usize;
                arguments[i].push_str(call["function"]["arguments"].as_str().unwrap());
            }
        }
        for (i, joined) in arguments.iter().enumerate() {
            let parsed: Value = serde_json::from_str(joined).unwrap();
            assert_eq!(
                parsed,
                serde_json::json!({"key": format!("k{i}"), "ms": 100})
            );
        }
        assert!(
            tools.len() > 2 * 3,
            "arguments in several fragments: {tools:?}"
        );
        for frame in anthropic_frames(spec, 0)
            .iter()
            .chain(&anthropic_frames(spec, 2))
        {
            let data = frame
                .lines()
                .nth(1)
                .unwrap()
                .strip_prefix("data: ")
                .unwrap();
            serde_json::from_str::<Value>(data).unwrap();
        }
    }
}
