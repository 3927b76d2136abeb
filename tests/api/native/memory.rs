//! Memory, judges and the research learner through the service, with the
//! fake provider answering the extraction and the judges too.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{TestApp, spawn_app_with, test_settings},
    on_both_backends,
    support::{Backend, TestDb},
};

const EXTRACTED: &str = r#"{"memories": [
  {"kind": "fact", "key": "home_city", "content": "The user lives in Lyon."},
  {"kind": "preference", "key": "answer_format", "content": "The user prefers bullet points."}
]}"#;

async fn app(
    backend: Backend,
    configure: impl FnOnce(&mut harness_core::config::Settings),
) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.memory.extraction = true;
    configure(&mut settings);
    spawn_app_with(TestDb::new(backend).await, provider, settings).await
}

/// Waits until the session has `count` jobs, all finished; returns them.
async fn jobs_done(app: &TestApp, session: &str, count: usize) -> Vec<Value> {
    for _ in 0..200 {
        let (_, listed) = app.get_json(&format!("/sessions/{session}/jobs")).await;
        let jobs = listed["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.len() == count
            && jobs
                .iter()
                .all(|j| j["status"] == "done" || j["status"] == "failed")
        {
            return jobs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the session's jobs did not finish");
}

async fn turn(app: &TestApp, session: &str, body: Value) -> Value {
    let response = app.post_turn(session, body).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn a_fact_told_in_one_turn_is_in_the_next_prompt_until_forgotten(backend: Backend) {
    let app = app(backend, |_| {}).await;
    app.provider
        .enqueue([Reply::sse("openai/text.sse"), Reply::openai_text(EXTRACTED)]);
    turn(
        &app,
        "s-mem-1",
        json!({"message": "I live in Lyon, and I like bullet points.", "user_id": "ann"}),
    )
    .await;
    let jobs = jobs_done(&app, "s-mem-1", 1).await;
    assert_eq!(jobs[0]["kind"], "memory_extraction");
    assert_eq!(jobs[0]["status"], "done", "{jobs:?}");
    // The extraction's usage is recorded on its job.
    assert_eq!(
        (
            jobs[0]["input_tokens"].as_i64(),
            jobs[0]["output_tokens"].as_i64()
        ),
        (Some(120), Some(40))
    );
    let extraction = &app.provider.requests()[1];
    assert_eq!(extraction.body["max_completion_tokens"], 400);
    assert!(
        extraction.body["messages"]
            .to_string()
            .contains("I live in Lyon")
    );

    let (_, listed) = app.get_json("/memories?scope=user:ann").await;
    let contents: Vec<&str> = listed["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents.len(), 2, "{listed}");
    assert!(contents.contains(&"The user lives in Lyon."));

    // Another session of the same user: the fact is in the prompt, the
    // preference in the context pack.
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(r#"{"memories": []}"#),
    ]);
    let result = turn(
        &app,
        "s-mem-2",
        json!({"message": "Which city do I live in?", "user_id": "ann"}),
    )
    .await;
    let sent = app.provider.requests()[2].body["messages"].to_string();
    assert!(
        sent.contains("What you remember about the user")
            && sent.contains("The user lives in Lyon."),
        "{sent}"
    );
    assert_eq!(
        result["context_pack_json"]["preferences"],
        json!(["The user prefers bullet points."])
    );
    jobs_done(&app, "s-mem-2", 1).await;

    // Forgetting removes it from the store and from later prompts.
    let response = app
        .client
        .delete(app.url("/memories?scope=user:ann"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let forgotten: Value = response.json().await.unwrap();
    assert_eq!(forgotten["deleted"], 2);
    let (_, listed) = app.get_json("/memories?scope=user:ann").await;
    assert_eq!(listed["memories"], json!([]));
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(r#"{"memories": []}"#),
    ]);
    turn(
        &app,
        "s-mem-3",
        json!({"message": "Which city do I live in?", "user_id": "ann"}),
    )
    .await;
    let sent = app.provider.requests()[4].body["messages"].to_string();
    assert!(!sent.contains("Lyon"), "{sent}");
    // Another user's memories were never in reach.
    let (status, _) = app.get_json("/memories?scope=nobody").await;
    assert_eq!(status, 400);
}

async fn a_failing_extraction_leaves_the_turn_completed(backend: Backend) {
    let app = app(backend, |_| {}).await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text("I would rather not."),
    ]);
    let result = turn(&app, "s-mem-fail", json!({"message": "I live in Lyon."})).await;
    assert_eq!(result["status"], "completed");
    let jobs = jobs_done(&app, "s-mem-fail", 1).await;
    assert_eq!(jobs[0]["status"], "failed");
    assert!(
        jobs[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("no JSON object"),
        "{jobs:?}"
    );
    // The model answered (prose): that call was paid for, and shows.
    // (Before, a failed job showed 0 and 0.)
    assert_eq!(
        (
            jobs[0]["input_tokens"].as_i64(),
            jobs[0]["output_tokens"].as_i64()
        ),
        (Some(120), Some(40)),
        "{jobs:?}"
    );
    assert!(
        jobs[0]["cost_usd"].as_f64().is_some_and(|c| c > 0.0),
        "{jobs:?}"
    );
    let (_, listed) = app.get_json("/memories?scope=session:s-mem-fail").await;
    assert_eq!(listed["memories"], json!([]));
}

async fn a_judge_scores_the_turn_after_it_ends(backend: Backend) {
    let app = app(backend, |s| {
        s.memory.extraction = false;
        s.harness.prompt_id = Some("support".into());
        s.harness.prompt_version = Some("3".into());
        s.judges.list = Some(
            json!([
                {"name": "relevance", "criteria": "The answer addresses the question.", "threshold": 0.5},
                {"name": "other_prompt", "criteria": "x", "prompt_ids": ["billing"]}
            ])
            .to_string()
            .parse()
            .unwrap(),
        );
    })
    .await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(r#"{"score": 0.9, "rationale": "It answers the greeting."}"#),
    ]);
    let result = turn(&app, "s-judge", json!({"message": "Hello?"})).await;
    let turn_id = result["turn_id"].as_str().unwrap().to_owned();
    let jobs = jobs_done(&app, "s-judge", 1).await;
    assert_eq!(jobs[0]["kind"], "judge", "only the judge of this prompt");
    let (status, judged) = app
        .get_json(&format!("/sessions/s-judge/turns/{turn_id}/judgements"))
        .await;
    assert_eq!(status, 200);
    let judgement = &judged["judgements"][0];
    assert_eq!(
        (judgement["judge"].as_str(), judgement["score"].as_f64()),
        (Some("relevance"), Some(0.9))
    );
    assert_eq!(
        (
            judgement["passed"].as_bool(),
            judgement["prompt_version"].as_str()
        ),
        (Some(true), Some("3"))
    );
    let judge_request = app.provider.requests()[1].body.to_string();
    assert!(
        judge_request.contains("The answer addresses the question."),
        "{judge_request}"
    );
    // The judgement is on the session's log, after the turn's end.
    let (_, log) = app.get_json("/sessions/s-judge/events").await;
    let last = log["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["type"].as_str(), last["judged_turn_id"].as_str()),
        (Some("judgement"), Some(turn_id.as_str()))
    );
    // A failing judge leaves the turn completed and no judgement.
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text("no verdict"),
    ]);
    let result = turn(&app, "s-judge", json!({"message": "And now?"})).await;
    assert_eq!(result["status"], "completed");
    let jobs = jobs_done(&app, "s-judge", 2).await;
    assert_eq!(jobs[1]["status"], "failed");
    let second = result["turn_id"].as_str().unwrap();
    let (_, judged) = app
        .get_json(&format!("/sessions/s-judge/turns/{second}/judgements"))
        .await;
    assert_eq!(judged["judgements"], json!([]));
}

async fn the_research_learner_keeps_each_turn_with_its_stored_answer(backend: Backend) {
    let app = app(backend, |s| s.memory.extraction = false).await;
    app.provider.enqueue([Reply::sse("openai/text.sse")]);
    turn(&app, "s-learn", json!({"message": "What is new?"})).await;
    let (_, observed) = app.get_json("/sessions/s-learn/observations").await;
    let observation = &observed["observations"][0];
    assert_eq!(observation["user_text"], "What is new?");
    let (_, messages) = app.get_json("/sessions/s-learn/messages").await;
    let answer_id = messages["messages"][1]["message_id"].as_str().unwrap();
    assert_eq!(
        observation["source_id"],
        format!("chat_message:{answer_id}")
    );
}

async fn with_embeddings_a_memory_is_found_by_meaning(backend: Backend) {
    let app = app(backend, |s| {
        s.vault.embeddings = Some("openai:text-embedding-3-small".parse().unwrap());
    })
    .await;
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(
            r#"{"memories": [{"kind": "fact", "key": "vehicle", "content": "The user drives a car."}]}"#,
        ),
    ]);
    turn(
        &app,
        "s-mem-e1",
        json!({"message": "I drive a car to work.", "user_id": "bo"}),
    )
    .await;
    jobs_done(&app, "s-mem-e1", 1).await;
    // The memory's embedding was asked for with the extraction.
    assert!(
        app.provider
            .embedding_requests()
            .iter()
            .any(|r| r.body["input"] == json!(["The user drives a car."]))
    );
    // No word of the question is in the memory; its meaning is.
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(r#"{"memories": []}"#),
    ]);
    turn(
        &app,
        "s-mem-e2",
        json!({"message": "Is my automobile insured?", "user_id": "bo"}),
    )
    .await;
    let sent = app.provider.requests()[2].body["messages"].to_string();
    assert!(sent.contains("The user drives a car."), "{sent}");
    jobs_done(&app, "s-mem-e2", 1).await;
}

/// Issue 63: a memory extraction and a judge that are under way when
/// their session is erased write nothing after the erase: their model
/// answers come after the 204, and a scan of every table finds no row of
/// the session, no memory and no judgement. (Before, both were written
/// after the erase, and the judge's event queued a job for it.)
async fn jobs_under_way_when_their_session_is_erased_write_nothing(backend: Backend) {
    let app = app(backend, |s| {
        s.harness.prompt_id = Some("support".into());
        s.judges.list = Some(
            json!([{"name": "relevance", "criteria": "On topic.", "threshold": 0.5}])
                .to_string()
                .parse()
                .unwrap(),
        );
    })
    .await;
    let gate = tokio_util::sync::CancellationToken::new();
    let held = gate.clone();
    app.provider
        .respond_with(std::sync::Arc::new(move |body: &Value| {
            let system = body["messages"][0]["content"].to_string();
            if system.contains("You are an evaluator") {
                Reply::openai_text(r#"{"score": 0.9, "rationale": "Fine."}"#).hold_head(&held)
            } else if system.contains("You keep a memory") {
                Reply::openai_text(EXTRACTED).hold_head(&held)
            } else {
                Reply::openai_text("Noted.")
            }
        }));
    let result = turn(
        &app,
        "s-erased-mid-job",
        json!({"message": "I live in Lyon.", "user_id": "cy"}),
    )
    .await;
    let turn_id = result["turn_id"].as_str().unwrap().to_owned();
    // Both side calls are asked, and held.
    for _ in 0..200 {
        if app.provider.requests().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(app.provider.requests().len(), 3);
    let erased = app
        .client
        .delete(app.url("/sessions/s-erased-mid-job"))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    gate.cancel();
    // Time for what a job would still write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let needles = ["s-erased-mid-job".to_owned(), turn_id];
    let left = app.db.rows_naming(&needles).await;
    assert!(left.values().all(|count| *count == 0), "{left:?}");
    let (_, memories) = app.get_json("/memories?scope=user:cy").await;
    assert_eq!(memories["memories"], json!([]), "{memories}");
}

on_both_backends!(
    jobs_under_way_when_their_session_is_erased_write_nothing,
    with_embeddings_a_memory_is_found_by_meaning,
    a_fact_told_in_one_turn_is_in_the_next_prompt_until_forgotten,
    a_failing_extraction_leaves_the_turn_completed,
    a_judge_scores_the_turn_after_it_ends,
    the_research_learner_keeps_each_turn_with_its_stored_answer,
);

/// With `HARNESS_REDACT_LOGS`, a judge's job (what the judge model reads)
/// and its judgement (the rationale it wrote) show no personal data; the
/// history keeps the message as it was sent. (Before, both carried it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redaction_a_judge_reads_and_writes_no_personal_data() {
    let app = app(Backend::Sqlite, |s| {
        s.memory.extraction = false;
        s.telemetry.redact_logs = true;
        s.harness.prompt_id = Some("support".into());
        s.judges.list = Some(
            json!([{"name": "relevance", "criteria": "On topic.", "threshold": 0.5}])
                .to_string()
                .parse()
                .unwrap(),
        );
    })
    .await;
    app.provider.enqueue([
        Reply::openai_text("Noted, bob@example.com."),
        Reply::openai_text(
            r#"{"score": 0.9, "rationale": "It confirms bob@example.com and card 4111 1111 1111 1111."}"#,
        ),
    ]);
    let message = "I am bob@example.com, card 4111 1111 1111 1111";
    let result = turn(&app, "s-judge-private", json!({"message": message})).await;
    let turn_id = result["turn_id"].as_str().unwrap().to_owned();
    jobs_done(&app, "s-judge-private", 1).await;
    let judge_request = app.provider.requests()[1].body.to_string();
    assert!(judge_request.contains("On topic."), "{judge_request}");
    assert!(judge_request.contains("[redacted]"), "{judge_request}");
    let (_, judged) = app
        .get_json(&format!(
            "/sessions/s-judge-private/turns/{turn_id}/judgements"
        ))
        .await;
    let rationale = judged["judgements"][0]["rationale"].as_str().unwrap();
    assert_eq!(rationale, "It confirms [redacted] and card [redacted].");
    for text in [judge_request.as_str(), rationale] {
        assert!(!text.contains("bob@example.com"), "{text}");
        assert!(!text.contains("4111 1111 1111 1111"), "{text}");
    }
    let (_, history) = app.get_json("/sessions/s-judge-private/messages").await;
    assert_eq!(history["messages"][0]["content"], message);
}

/// Turns come faster than memory extraction can follow (its model never
/// answers; one job at a time): the backlog stays within its bound (3),
/// the oldest waiting extractions are given up and counted, and the
/// gauges show the backlog. (Before, the backlog grew without end and
/// nothing showed it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_the_worker_cannot_follow_stays_bounded() {
    let app = app(Backend::Sqlite, |s| {
        s.memory.job_concurrency = 1;
        s.memory.job_backlog_max = 3;
    })
    .await;
    let never = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::sse("openai/text.sse"),
        Reply::openai_text(EXTRACTED).hold_head(&never),
    ]);
    turn(&app, "s-backlog", json!({"message": "turn 1"})).await;
    // The worker is stuck on the first extraction.
    for _ in 0..100 {
        if app.provider.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.provider.requests().len(), 2);
    for n in 2..=9 {
        app.provider.enqueue([Reply::sse("openai/text.sse")]);
        turn(&app, "s-backlog", json!({"message": format!("turn {n}")})).await;
    }
    // Within a backlog check or two, the rest is shed and the bound holds.
    let shed_metric = "agent_harness_jobs_shed_total{kind=\"memory_extraction\"}";
    let mut shed = 0.0;
    for _ in 0..60 {
        shed = app.metric(shed_metric).await;
        if shed >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shed, 5.0, "8 queued, 3 kept");
    assert_eq!(app.metric("agent_harness_jobs_pending").await, 3.0);
    assert!(app.metric("agent_harness_job_oldest_age_seconds").await >= 0.0);
    let (_, listed) = app.get_json("/sessions/s-backlog/jobs").await;
    let jobs = listed["jobs"].as_array().unwrap();
    let given_up: Vec<&Value> = jobs
        .iter()
        .filter(|j| {
            j["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("HARNESS_JOB_BACKLOG_MAX"))
        })
        .collect();
    assert_eq!(given_up.len(), 5, "{listed}");
    // The oldest waiting ones went: turns 2 to 6; 7, 8 and 9 still wait.
    let waiting: Vec<&Value> = jobs.iter().filter(|j| j["status"] == "pending").collect();
    assert_eq!(waiting.len(), 3, "{listed}");
    never.cancel();
}

/// Memory extraction and the judges read a turn's text alone, unless the
/// operator lets them see its images (`HARNESS_MEMORY_IMAGES`,
/// `HARNESS_JUDGES_IMAGES`): then their calls carry the turn's image as
/// the turn's own call did.
#[tokio::test]
async fn background_jobs_see_a_turns_images_only_when_the_operator_says_so() {
    use base64::Engine as _;
    let png = crate::helpers::png_of(600);
    let data_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    for images in [false, true] {
        let app = app(Backend::Sqlite, |s| {
            s.memory.images = images;
            s.judges.images = images;
            s.harness.prompt_id = Some("support".into());
            s.judges.list = Some(
                json!([{"name": "relevance", "criteria": "The answer fits."}])
                    .to_string()
                    .parse()
                    .unwrap(),
            );
        })
        .await;
        app.provider.enqueue([
            Reply::sse("openai/text.sse"),
            Reply::openai_text(EXTRACTED),
            Reply::openai_text(r#"{"score": 0.9, "rationale": "Fine."}"#),
        ]);
        let message = json!([
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "data": base64::engine::general_purpose::STANDARD.encode(&png), "media_type": "image/png"}
        ]);
        turn(&app, "s-seen", json!({"message": message})).await;
        // Both ran (in either order: which reply each got is not the point).
        jobs_done(&app, "s-seen", 2).await;
        let requests = app.provider.requests();
        assert_eq!(requests.len(), 3);
        let image_in = |body: &Value| body.to_string().contains(&data_url);
        assert!(image_in(&requests[0].body), "the turn's own call");
        for job_call in &requests[1..] {
            let body = &job_call.body;
            assert!(body.to_string().contains("What is in this picture?"));
            assert_eq!(image_in(body), images, "images {images}: {body}");
        }
    }
}
