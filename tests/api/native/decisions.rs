//! `GET /sessions/{id}/decisions`: pages with a cursor, a strategy filter,
//! and records of the documented shape.

use harness_base::turn::DecisionDetails;
use serde_json::{Value, json};

use crate::{fake_provider::Reply, helpers::spawn_app, on_both_backends, support::Backend};

async fn decisions_page_with_a_cursor_and_filter_by_strategy(backend: Backend) {
    let app = spawn_app(backend).await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_tool_call("call_d1", "local_search", &json!({"query": "hello"})),
        Reply::sse("openai/text.sse"),
        Reply::sse("openai/text.sse"),
    ]);
    for message in ["first", "second", "third"] {
        let response = app.post_turn("s-dec", json!({"message": message})).await;
        assert_eq!(response.status(), 200);
    }
    let (status, page) = app.get_json("/sessions/s-dec/decisions?limit=2").await;
    assert_eq!(status, 200, "{page}");
    let first: Vec<Value> = page["decisions"].as_array().unwrap().clone();
    assert_eq!(first.len(), 2);
    let cursor = page["next_after"].as_str().unwrap().to_owned();
    assert_eq!(cursor, first[1]["id"].as_str().unwrap());
    let (_, rest) = app
        .get_json(&format!("/sessions/s-dec/decisions?limit=2&after={cursor}"))
        .await;
    let rest: Vec<Value> = rest["decisions"].as_array().unwrap().clone();
    assert_eq!(rest.len(), 1);
    let messages: Vec<String> = first
        .iter()
        .chain(&rest)
        .map(|d| {
            let details: DecisionDetails = serde_json::from_value(d["record"].clone())
                .unwrap_or_else(|e| panic!("a record of the documented shape: {e}: {d}"));
            details.user_message
        })
        .collect();
    assert_eq!(messages, ["first", "second", "third"], "oldest first");

    let (_, filtered) = app
        .get_json("/sessions/s-dec/decisions?strategy=retrieval_augmented")
        .await;
    let filtered = filtered["decisions"].as_array().unwrap();
    assert_eq!(filtered.len(), 1);
    assert_eq!(filtered[0]["record"]["user_message"], "second");
    assert!(filtered[0]["record"]["tools_used"] == json!(["local_search"]));

    for bad in ["after=nope", "limit=0", "strategy=x&color=red"] {
        let (status, problem) = app
            .get_json(&format!("/sessions/s-dec/decisions?{bad}"))
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some("invalid_query")),
            "{bad}"
        );
    }
}

on_both_backends!(decisions_page_with_a_cursor_and_filter_by_strategy);
