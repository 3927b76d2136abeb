//! Images and files through every protocol that carries them: each in its
//! own shape reaches the model as the provider takes it, and what cannot
//! be read is refused in the protocol's own error, never dropped.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::{
    fake_provider::Reply,
    helpers::{TestApp, png_of, spawn_app},
    support::Backend,
};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The image parts of the user message of the provider's last request.
fn sent_images(app: &TestApp) -> Vec<String> {
    let requests = app.provider.requests();
    let body = &requests.last().unwrap().body;
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()
        .clone();
    user["content"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p["image_url"]["url"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, String) {
    app.post_for_text(path, &body).await
}

#[tokio::test]
async fn every_protocol_sends_its_images_to_the_model() {
    let app = spawn_app(Backend::Sqlite).await;
    let png = png_of(500);
    let data_url = format!("data:image/png;base64,{}", b64(&png));
    let (_, uploaded) = app.upload("shot.png", "image/png", &png).await;
    let file_id = uploaded["id"].as_str().unwrap().to_owned();
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is it?"},
                {"type": "image_url", "image_url": {"url": data_url, "detail": "high"}}
            ]}]}),
        ),
        (
            "/v1/responses",
            json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What is it?"},
                {"type": "input_image", "file_id": file_id, "detail": "auto"}
            ]}]}),
        ),
        (
            "/v1/ui/chat",
            json!({"id": "ui-img", "messages": [{"id": "m1", "role": "user", "parts": [
                {"type": "text", "text": "What is it?"},
                {"type": "file", "mediaType": "image/png", "url": data_url, "filename": "a.png"}
            ]}]}),
        ),
        (
            "/v1/agui",
            json!({"threadId": "agui-img", "runId": "r1", "messages": [{"id": "m1", "role": "user",
            "content": [
                {"type": "text", "text": "What is it?"},
                {"type": "image", "source": {"type": "data", "value": b64(&png), "mimeType": "image/png"}}
            ]}]}),
        ),
        (
            "/a2a",
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "messageId": "m1", "role": "ROLE_USER", "parts": [
                {"text": "What is it?"},
                {"raw": b64(&png), "mediaType": "image/png", "filename": "a.png"}
            ]}}}),
        ),
    ];
    for (path, body) in cases {
        app.provider.enqueue([Reply::sse("openai/text.sse")]);
        let (status, answer) = post(&app, path, body).await;
        assert_eq!(status, 200, "{path}: {answer}");
        for failed in ["\"error\":{", "\"type\":\"error\"", "RUN_ERROR"] {
            assert!(!answer.contains(failed), "{path}: {answer}");
        }
        assert_eq!(sent_images(&app), std::slice::from_ref(&data_url), "{path}");
    }
}

#[tokio::test]
async fn what_cannot_be_read_is_refused_in_each_protocols_own_error() {
    let app = spawn_app(Backend::Sqlite).await;
    let zip = b64(b"PK\x03\x04 an archive");
    // Chat completions and Responses: OpenAI's error (a problem document
    // whose `code` says it).
    let (status, answer) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
        ]}]}),
    )
    .await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer.contains("unsupported_content"), "{answer}");
    let (status, answer) = post(
        &app,
        "/v1/responses",
        json!({"input": [{"role": "user", "content": [
            {"type": "input_file", "file_data": format!("data:application/zip;base64,{zip}"), "filename": "a.zip"}
        ]}]}),
    )
    .await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer.contains("unsupported_media_type"), "{answer}");
    // A2A: ContentTypeNotSupportedError.
    let (status, answer) = post(
        &app,
        "/a2a",
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m1", "role": "ROLE_USER", "parts": [
            {"text": "Unpack this."},
            {"raw": zip, "mediaType": "application/zip", "filename": "a.zip"}
        ]}}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["code"], -32005, "{answer}");
    // A file of no one's: not found (A2A: invalid params, not a task).
    let (status, answer) = post(
        &app,
        "/a2a",
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m2", "role": "ROLE_USER", "parts": [
            {"url": "https://127.0.0.1/a.png", "mediaType": "image/png"}
        ]}}}),
    )
    .await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(app.provider.requests().is_empty(), "no call was made");
}

#[tokio::test]
async fn mcp_ask_takes_files_and_vault_notes_as_attachments() {
    use crate::protocols::mcp_current::request;
    let vault = crate::helpers::vault_of(&[("notes/plan.md", "# Plan\nShip on Friday.\n")]);
    let app = crate::helpers::spawn_app_with_vault(Backend::Sqlite, vault.path()).await;
    let png = png_of(400);
    let (_, uploaded) = app.upload("shot.png", "image/png", &png).await;
    let file_id = uploaded["id"].as_str().unwrap();
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    let params = json!({"name": "ask", "arguments": {
        "message": "Does the screenshot match the plan?",
        "attachments": [file_id, "vault:///notes/plan.md"]
    }});
    let (status, answer) = request(&app, None, "tools/call", Some("ask"), params, false).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let images = sent_images(&app);
    assert_eq!(images, [format!("data:image/png;base64,{}", b64(&png))]);
    let sent = app.provider.requests().last().unwrap().body["messages"].to_string();
    assert!(
        sent.contains("Ship on Friday.") && sent.contains("UNTRUSTED_CONTEXT"),
        "{sent}"
    );

    // What cannot be attached is the arguments' fault: -32602.
    for attachments in [
        json!(["vault:///notes/missing.md"]),
        json!(["file-never-made"]),
        json!(["https://example.com/a.png"]),
    ] {
        let params =
            json!({"name": "ask", "arguments": {"message": "Hi", "attachments": attachments}});
        let (_, answer) = request(&app, None, "tools/call", Some("ask"), params, false).await;
        assert_eq!(answer["error"]["code"], -32602, "{attachments}: {answer}");
    }
    assert_eq!(app.provider.requests().len(), 1);
}
