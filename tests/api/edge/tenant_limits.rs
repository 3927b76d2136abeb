//! What a tenant may spend: running turns (counted in the database),
//! requests in flight, tokens per day; and `GET /usage`.

use crate::support::reply::JsonReply as _;
use reqwest::Client;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    edge::tenants::{client_with_key, make_keys},
    fake_provider::{FakeProvider, Reply},
    helpers::{SseStream, TestApp, spawn_app_with, test_settings, types},
    on_both_backends,
    support::{Backend, TestDb},
};

/// An app with keys on and two tenants, `acme` (the app's client) and
/// `globex` (the second client).
async fn two_tenants(
    backend: Backend,
    configure: impl FnOnce(&mut harness_core::config::Settings),
) -> (TestApp, Client) {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.auth = harness_core::config::AuthMode::On;
    configure(&mut settings);
    let mut app = spawn_app_with(TestDb::new(backend).await, provider, settings).await;
    make_keys(
        &app,
        &[("key_a", "acme", "ah_a"), ("key_b", "globex", "ah_b")],
    )
    .await;
    app.client = client_with_key("ah_a");
    (app, client_with_key("ah_b"))
}

async fn start(client: &Client, app: &TestApp, session: &str) -> reqwest::Response {
    client
        .post(app.url(&format!("/sessions/{session}/turns")))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "Hi"}))
        .send()
        .await
        .unwrap()
}

/// The status `GET /tools` answers `client`.
async fn tools_status(client: &Client, app: &TestApp) -> u16 {
    client
        .get(app.url("/tools"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn refused(response: reqwest::Response, code: &str) -> Value {
    assert_eq!(response.status(), 429, "{code}");
    assert!(response.headers().contains_key("retry-after"), "{code}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], code, "{problem}");
    problem
}

/// A tenant runs at most its turns at once, whatever route starts them
/// (a background response too), and its own limit overrides the default;
/// another tenant starts its turns all the while. (Before, one tenant
/// could take every running slot.)
async fn a_tenant_runs_at_most_its_turns_and_no_more(backend: Backend) {
    let (app, globex) = two_tenants(backend, |s| s.server.tenant_max_running_turns = 2).await;
    let store = app.db.open().await;
    store
        .set_tenant_limits(
            "globex",
            &harness_store::store::TenantLimits {
                max_running_turns: Some(1),
                ..Default::default()
            },
            chrono::Utc::now(),
        )
        .await
        .unwrap();
    let gate = CancellationToken::new();
    app.provider
        .enqueue((0..3).map(|_| Reply::openai_text("Done.").hold_head(&gate)));
    let keyed = || {
        app.client
            .post(app.url("/sessions/a-1/turns"))
            .header("accept", "text/event-stream")
            .header("idempotency-key", "k-1")
            .json(&json!({"message": "Hi"}))
            .send()
    };
    let first = keyed().await.unwrap();
    assert_eq!(first.status(), 200);
    let first_turn = first.headers()["x-turn-id"].clone();
    let mut held = vec![SseStream::new(first).await];
    let response = start(&app.client, &app, "a-2").await;
    assert_eq!(response.status(), 200);
    held.push(SseStream::new(response).await);
    refused(start(&app.client, &app, "a-3").await, "tenant_busy").await;
    // At its limit, a request sent again with its key still gets its turn,
    // and a session's running turn still says so. (Before, both were 429.)
    let again = keyed().await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["x-turn-id"], first_turn);
    drop(again);
    let running = start(&app.client, &app, "a-2").await;
    assert_eq!(running.status(), 409);
    let background = app
        .client
        .post(app.url("/v1/responses"))
        .json(&json!({"input": "Hi", "background": true}))
        .send()
        .await
        .unwrap();
    refused(background, "tenant_busy").await;
    // Another tenant is not held back, and keeps to its own limit.
    let response = start(&globex, &app, "b-1").await;
    assert_eq!(response.status(), 200);
    held.push(SseStream::new(response).await);
    refused(start(&globex, &app, "b-2").await, "tenant_busy").await;
    gate.cancel();
    for mut stream in held {
        let events = stream.read_to_end().await;
        assert_eq!(types(&events).last(), Some(&"turn.completed"));
    }
    app.provider.enqueue([Reply::openai_text("Again.")]);
    let again = start(&app.client, &app, "a-3").await;
    assert_eq!(again.status(), 200, "a slot is free again");
    SseStream::new(again).await.read_to_end().await;
    assert_eq!(app.provider.requests().len(), 4, "no refused turn asked");
}

/// A tenant's tokens of the UTC day: past 80% a `quota.warning` event, and
/// once used up the next turn is refused before any provider request,
/// until the reset; `GET /usage` shows the tenant's own. (Before, nothing
/// counted a tenant's tokens.)
async fn a_tenant_past_its_tokens_of_the_day_is_refused(backend: Backend) {
    // Each recorded answer uses 120 + 40 tokens.
    let (app, globex) = two_tenants(backend, |s| s.server.tenant_tokens_per_day = Some(350)).await;
    let mut warned = Vec::new();
    for session in ["q-1", "q-2", "q-3"] {
        app.provider.enqueue([Reply::openai_text("Counted.")]);
        let response = start(&app.client, &app, session).await;
        assert_eq!(response.status(), 200);
        let events = SseStream::new(response).await.read_to_end().await;
        assert_eq!(types(&events).last(), Some(&"turn.completed"));
        warned.push(events.iter().find(|e| e.event == "quota.warning").map(|e| {
            let warning = e.json();
            (
                warning["tokens_today"].clone(),
                warning["tokens_per_day"].clone(),
            )
        }));
    }
    assert_eq!(warned[..2], [None, None], "under 80%");
    assert_eq!(warned[2], Some((json!(320), json!(350))));
    let asked = app.provider.requests().len();
    let problem = refused(start(&app.client, &app, "q-4").await, "quota_exceeded").await;
    assert!(
        problem["detail"].as_str().unwrap().contains("480"),
        "{problem}"
    );
    assert_eq!(app.provider.requests().len(), asked, "no provider request");
    let (status, usage) = app.get_json("/usage").await;
    assert_eq!(status, 200);
    assert_eq!(usage["tenant"], "acme");
    assert_eq!(
        (
            &usage["today"]["input_tokens"],
            &usage["today"]["output_tokens"],
            &usage["today"]["tokens"]
        ),
        (&json!(360), &json!(120), &json!(480)),
        "{usage}"
    );
    assert!(
        usage["today"]["cost_usd"].as_f64().unwrap() > 0.0,
        "{usage}"
    );
    assert_eq!(usage["month"]["tokens"], 480);
    assert_eq!(usage["limits"]["tokens_per_day"], 350);
    assert_eq!(usage["limits"]["max_running_turns"], 64);
    // Another tenant's day is its own.
    let theirs: Value = globex.get(app.url("/usage")).json_reply().await;
    assert_eq!(
        (&theirs["tenant"], &theirs["today"]["tokens"]),
        (&json!("globex"), &json!(0))
    );
    app.provider.enqueue([Reply::openai_text("Theirs.")]);
    let response = start(&globex, &app, "g-1").await;
    assert_eq!(response.status(), 200);
    SseStream::new(response).await.read_to_end().await;
}

/// A tenant holds at most its requests open at once in one process (event
/// streams included); past it 429 `too_many_streams` at once, while
/// another tenant and the probes are served. (Before, one key holding
/// followers of a waiting turn could take every connection.)
async fn a_tenant_holds_at_most_its_streams(backend: Backend) {
    let (app, globex) = two_tenants(backend, |s| s.server.tenant_max_streams = 2).await;
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::openai_text("Streamed.").hold_head(&gate)]);
    let response = start(&app.client, &app, "st-1").await;
    let turn = response.headers()["x-turn-id"].to_str().unwrap().to_owned();
    let mut first = SseStream::new(response).await;
    let follower = app
        .client
        .get(app.url(&format!("/sessions/st-1/turns/{turn}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(follower.status(), 200);
    let mut second = SseStream::new(follower).await;
    let third = app.client.get(app.url("/tools")).send().await.unwrap();
    refused(third, "too_many_streams").await;
    assert_eq!(
        globex.get(app.url("/tools")).send().await.unwrap().status(),
        200
    );
    let probe = reqwest::get(app.url("/healthz")).await.unwrap();
    assert_eq!(probe.status(), 200);
    gate.cancel();
    first.read_to_end().await;
    second.read_to_end().await;
    drop((first, second));
    // Given back once the streams ended.
    let mut served = 0;
    for _ in 0..50 {
        if tools_status(&app.client, &app).await == 200 {
            served += 1;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(served, 1);
}

/// A tenant's requests past its limits cost the store nothing: its key,
/// verified lately, is refused from what the process knows, so a flood of
/// them reads no key from the database; a request that goes on is still
/// verified, so a revoked key is refused at once. (Before, every refusal
/// read its key first.) On Postgres, whose queries are logged on the
/// test's thread.
#[tokio::test]
async fn a_flood_past_a_tenants_streams_reads_no_key() {
    use tracing_subscriber::{Layer, layer::SubscriberExt};
    let logs = crate::edge::errors::Logs::default();
    let _capture = crate::support::capture::capture(
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(logs.clone())
                .with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target("sqlx::query", tracing::Level::DEBUG),
                ),
        ),
    );
    let (app, globex) = two_tenants(Backend::Postgres, |s| s.server.tenant_max_streams = 1).await;
    let key_reads = || {
        String::from_utf8_lossy(&logs.0.lock().unwrap())
            .matches("FROM api_keys")
            .count()
    };
    let gate = CancellationToken::new();
    app.provider
        .enqueue([Reply::openai_text("Streamed.").hold_head(&gate)]);
    let held = SseStream::new(start(&app.client, &app, "fl-1").await).await;
    assert!(key_reads() > 0, "the store's queries are captured");
    let before = key_reads();
    for _ in 0..20 {
        let response = app.client.get(app.url("/tools")).send().await.unwrap();
        refused(response, "too_many_streams").await;
    }
    assert_eq!(key_reads(), before, "refused without reading the key");
    // The other tenant is served, and verified.
    assert_eq!(
        globex.get(app.url("/tools")).send().await.unwrap().status(),
        200
    );
    assert_eq!(key_reads(), before + 1);
    gate.cancel();
    let mut held = held;
    held.read_to_end().await;
    drop(held);
    // Revoked: the next request that would be served is refused at once.
    let store = app.db.open().await;
    assert!(
        store
            .revoke_api_key("key_a", chrono::Utc::now())
            .await
            .unwrap()
    );
    let mut status = 0;
    for _ in 0..50 {
        status = tools_status(&app.client, &app).await;
        if status != 429 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status, 401, "a revoked key");
}

on_both_backends!(
    a_tenant_runs_at_most_its_turns_and_no_more,
    a_tenant_past_its_tokens_of_the_day_is_refused,
    a_tenant_holds_at_most_its_streams,
);

/// `globex`'s sequential JSON turns; every one is answered 200.
async fn serve_turns(client: &Client, app: &TestApp, count: usize) {
    for i in 0..count {
        let response = client
            .post(app.url(&format!("/sessions/b-{i}/turns")))
            .json(&json!({"message": "Hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "a turn of the other tenant");
        response.bytes().await.unwrap();
    }
}

/// `acme` keeps `workers` requests going (each asks again once
/// answered) while `globex` runs its turns; how often `acme` was refused.
async fn under_load(app: &TestApp, globex: &Client, workers: usize) -> usize {
    let stop = CancellationToken::new();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (client, url, stop, refused) = (
            app.client.clone(),
            app.url(&format!("/sessions/a-{worker}/turns")),
            stop.clone(),
            refused.clone(),
        );
        load.spawn(async move {
            // Bounded: it stops with the measurement, or after 5,000 tries.
            for _ in 0..5_000 {
                if stop.is_cancelled() {
                    break;
                }
                let answered = client
                    .post(&url)
                    .json(&json!({"message": "Load"}))
                    .send()
                    .await;
                if let Ok(response) = answered {
                    if response.status() == 429 {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    let _ = response.bytes().await;
                }
            }
        });
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    serve_turns(globex, app, TURNS).await;
    stop.cancel();
    while load.join_next().await.is_some() {}
    refused.load(std::sync::atomic::Ordering::Relaxed)
}

const TURNS: usize = 40;

/// A flood by one tenant, at ten times its limits, holds no turn of
/// another back: every one of them is served while the flood is refused.
/// How much it slows them is the bench's to measure (`bench run
/// --scenarios tenants`, docs/benchmarks.md "Tenants"), not a test's.
async fn a_flood_by_one_tenant_holds_no_other_back(backend: Backend) {
    let (app, globex) = two_tenants(backend, |s| {
        s.server.tenant_max_running_turns = 4;
        s.server.tenant_max_streams = 8;
    })
    .await;
    app.provider
        .respond_with(std::sync::Arc::new(|_: &Value| Reply::openai_text("Done.")));
    let refused = under_load(&app, &globex, 40).await;
    assert!(refused > 0, "the flooding tenant met its limits");
}

on_both_backends!(a_flood_by_one_tenant_holds_no_other_back);
