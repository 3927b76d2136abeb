//! The connection edge: slow or idle clients, too many connections, heads
//! too large. Raw TCP, as an attacker (or a broken client) would send.

use std::time::Duration;

use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

use crate::{
    fake_provider::{FakeProvider, Reply},
    helpers::{ServiceProcess, TestApp, spawn_app, spawn_app_with, test_settings},
    support::{Backend, TestDb},
};

async fn app_with_limits(max_connections: Option<usize>) -> TestApp {
    let provider = FakeProvider::start().await;
    let mut settings = test_settings(&provider);
    settings.server.header_read_timeout_s = 1;
    settings.server.idle_timeout_s = 3;
    settings.server.body_read_timeout_s = 1;
    settings.server.max_connections = max_connections;
    spawn_app_with(TestDb::new(Backend::Sqlite).await, provider, settings).await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; what it sent, and when.
async fn read_until_closed(tcp: &mut TcpStream) -> (String, Instant) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
            Err(_) => panic!("the server kept the connection open"),
        }
    }
    (
        String::from_utf8_lossy(&received).into_owned(),
        Instant::now(),
    )
}

#[tokio::test]
async fn slow_heads_are_cut_off_soon_and_idle_connections_later() {
    let app = app_with_limits(None).await;
    let started = Instant::now();
    // Slowloris: heads that never finish.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut tcp = connect(&app).await;
        tcp.write_all(b"POST /sessions/s/turns HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(tcp);
    }
    // A keep-alive connection that goes quiet after one request.
    let mut idle = connect(&app).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    // A connection that says nothing at all.
    let mut silent = connect(&app).await;
    // Others are served meanwhile.
    let (status, _) = app.get_json("/healthz").await;
    assert_eq!(status, 200);
    for tcp in &mut slow {
        let (_, closed) = read_until_closed(tcp).await;
        let after = closed - started;
        // The head timeout (1 s), not the idle one (3 s).
        assert!(after >= Duration::from_millis(900), "{after:?}");
        assert!(after < Duration::from_millis(2_500), "{after:?}");
    }
    // The idle keep-alive connection goes at the idle timeout, and so does
    // a new connection that never sent a byte: to its client it is idle.
    for (tcp, first_line) in [(&mut idle, "HTTP/1.1 200"), (&mut silent, "")] {
        let (answer, closed) = read_until_closed(tcp).await;
        assert!(answer.starts_with(first_line), "{answer}");
        let after = closed - started;
        assert!(after >= Duration::from_millis(2_900), "{after:?}");
        assert!(after < Duration::from_secs(5), "{after:?}");
    }
}

/// A client's pool opens connections ahead of need and may first use one
/// later than the head timeout (a request that found another connection
/// free leaves the new one idle). Closing it then races the client's
/// request on it: a turn the client cannot tell was started or not.
#[tokio::test]
async fn a_connection_first_used_after_the_head_timeout_is_served() {
    let app = app_with_limits(None).await;
    app.provider.enqueue([Reply::openai_text("Still here")]);
    let mut spare = connect(&app).await;
    // Past the head timeout (1 s), within the idle timeout (3 s).
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    let body = r#"{"message":"Hi"}"#;
    spare
        .write_all(
            format!(
                "POST /sessions/spare/turns HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut spare).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("Still here"), "{answer}");
}

#[tokio::test]
async fn a_body_that_trickles_in_gets_408_and_the_connection_closes() {
    let app = app_with_limits(None).await;
    let mut tcp = connect(&app).await;
    tcp.write_all(
        b"POST /sessions/s-slow/turns HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"message\":",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let (answer, closed) = read_until_closed(&mut tcp).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(closed - started <= Duration::from_secs(3));
    // Nothing was written.
    let (status, _) = app.get_json("/sessions/s-slow").await;
    assert_eq!(status, 404);
}

/// Issue 63's probe (issue 21's promise): past the file limit, a flood
/// of silent sockets locks nobody out, and each is closed by the head
/// timeout: with half the connection table or more taken, a socket that
/// has sent nothing gets the head timeout, not the idle one. (Before, each
/// one admitted waited the idle timeout: 191 of 306 were open 6 s after.)
#[tokio::test]
async fn silent_sockets_past_the_limit_lock_nobody_out_and_are_closed_by_the_head_timeout() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    provider.enqueue([Reply::openai_text("Still here")]);
    // 256 open files: 192 connection slots by default.
    let service = ServiceProcess::start(
        &db.sqlite_url(),
        &provider,
        &[
            ("HARNESS_HEADER_READ_TIMEOUT_S", "1"),
            ("HARNESS_IDLE_TIMEOUT_S", "30"),
        ],
        Some(256),
    )
    .await;
    let started = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(TcpStream::connect(service.addr()).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let health = client.get(service.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let turn = client
        .post(service.url("/sessions/past-the-cap/turns"))
        .json(&serde_json::json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(turn.status(), 200);
    let turn: Value = turn.json().await.unwrap();
    assert_eq!(turn["status"], "completed", "{turn}");
    // Each silent socket is gone by the head timeout (1 s from its accept,
    // which may come a little after its connect while the process is at
    // its descriptor limit), or sooner, its slot taken by a newer
    // connection; long before the idle timeout (30 s).
    for tcp in &mut silent {
        let (answer, closed) = read_until_closed(tcp).await;
        assert_eq!(answer, "");
        let after = closed - started;
        assert!(after < Duration::from_millis(4_500), "{after:?}");
    }
}

#[tokio::test]
async fn requests_never_hold_the_slots_kept_for_the_probes() {
    // Four connections: two are kept from requests (`reserved`).
    let app = app_with_limits(Some(4)).await;
    // Two streams in flight: the provider holds both turns.
    let gate = tokio_util::sync::CancellationToken::new();
    app.provider.enqueue([
        Reply::openai_text("one two").hold_after(2, &gate),
        Reply::openai_text("three four").hold_after(2, &gate),
    ]);
    let mut first = app
        .post_turn_sse("busy-1", serde_json::json!({"message": "Hi"}))
        .await;
    let mut second = app
        .post_turn_sse("busy-2", serde_json::json!({"message": "Hi"}))
        .await;
    first.read_until("message.delta").await;
    second.read_until("message.delta").await;
    // A third request is refused at once, on a slot it gives back; before,
    // it took the last slot, and the probes found none.
    let third = app
        .client
        .post(app.url("/sessions/busy-3/turns"))
        .json(&serde_json::json!({"message": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 429);
    let problem: Value = third.json().await.unwrap();
    assert_eq!(problem["code"], "too_many_streams");
    for probe in ["/healthz", "/readyz", "/metrics"] {
        let answered = tokio::time::timeout(
            Duration::from_secs(2),
            reqwest::Client::new().get(app.url(probe)).send(),
        )
        .await
        .expect("a probe gets a connection")
        .unwrap();
        assert_eq!(answered.status(), 200, "{probe}");
    }
    // The streams were not cut for them, and end as they should.
    gate.cancel();
    assert!(first.read_to_end().await.last().unwrap().is_terminal());
    assert!(second.read_to_end().await.last().unwrap().is_terminal());
}

#[tokio::test]
async fn an_overlong_uri_or_huge_headers_get_problem_json() {
    let app = spawn_app(Backend::Sqlite).await;
    let long = format!("/sessions/s-1?after={}", "1".repeat(10_000));
    let response = app.client.get(app.url(&long)).send().await.unwrap();
    assert_eq!(response.status(), 414);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "uri_too_long");

    let response = app
        .client
        .get(app.url("/healthz"))
        .header("x-big", "b".repeat(40_000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 431);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "headers_too_large");
}

#[tokio::test]
async fn the_chat_page_is_served_with_its_policy() {
    let app = crate::helpers::spawn_app(crate::support::Backend::Sqlite).await;
    let response = app.client.get(app.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    assert!(
        response.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("connect-src 'self'")
    );
    let page = response.text().await.unwrap();
    for part in [
        "id=\"message\"",
        "id=\"cancel\"",
        "last-event-id",
        "/events",
    ] {
        assert!(page.contains(part), "{part}");
    }
}

/// Sends `request` on a new connection and reads until the server closes
/// it; gives up on a server that keeps it open.
async fn exchange(addr: &str, request: &[u8]) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    read_until_closed(&mut tcp).await.0
}

/// The status and problem `code` of an answer, asserting it is a
/// problem document that closed its connection.
fn problem_of(answer: &str) -> (u16, String) {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head: {answer:?}"));
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-type: application/problem+json"),
        "{answer}"
    );
    assert!(head.contains("x-content-type-options: nosniff"), "{answer}");
    assert!(head.contains("cache-control: no-store"), "{answer}");
    let status = head[9..12].parse().unwrap();
    let problem: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{answer}"));
    (status, problem["code"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn smuggling_and_heads_hyper_refuses_get_problem_json_and_a_closed_connection() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    let service = ServiceProcess::start(&db.sqlite_url(), &provider, &[], None).await;
    let addr = service.addr();
    let post = |headers: &str, body: &str| {
        format!(
            "POST /sessions/smuggled/turns HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}\r\n{body}"
        )
        .into_bytes()
    };
    // Content-Length and Transfer-Encoding, in either order; the second
    // request on the connection is what a gateway reading the length
    // would pass on as part of the body.
    let smuggled = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    for headers in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
    ] {
        let body = format!("10\r\n{{\"message\":\"hi\"}}\r\n0\r\n\r\n{smuggled}");
        let answer = exchange(addr, &post(headers, &body)).await;
        assert_eq!(
            problem_of(&answer),
            (400, "malformed_request".to_owned()),
            "{answer}"
        );
        assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer}");
    }
    // Nothing of them was written.
    let client = reqwest::Client::new();
    let session = client
        .get(service.url("/sessions/smuggled"))
        .send()
        .await
        .unwrap();
    assert_eq!(session.status(), 404);
    // What hyper refuses itself, now as the service's problem documents.
    for (request, status, code) in [
        (
            post("Content-Length: 5\r\nContent-Length: 6\r\n", "{\"a\":1}"),
            400,
            "malformed_request",
        ),
        (
            post("Transfer-Encoding: xchunked\r\n", ""),
            400,
            "malformed_request",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Folded: a\r\n b\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
                "b".repeat(64 * 1024)
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
    ] {
        let answer = exchange(addr, &request).await;
        assert_eq!(problem_of(&answer), (status, code.to_owned()), "{answer}");
    }
    // A 100 KiB URL: past hyper's head ceiling, so it answers the head as
    // too large (431) or the URI as too long (414); either as a problem.
    let answer = exchange(
        addr,
        format!(
            "GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
            "u".repeat(100 * 1024)
        )
        .as_bytes(),
    )
    .await;
    let (status, code) = problem_of(&answer);
    assert!(
        (status, code.as_str()) == (431, "headers_too_large")
            || (status, code.as_str()) == (414, "uri_too_long"),
        "{answer}"
    );
    // A bad chunk size is still refused.
    let answer = exchange(
        addr,
        &post(
            "Transfer-Encoding: chunked\r\nConnection: close\r\n",
            "zz\r\n",
        ),
    )
    .await;
    assert_eq!(problem_of(&answer).0, 400, "{answer}");
}

#[tokio::test]
async fn a_body_announced_over_the_limit_is_refused_before_100_continue() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    let service = ServiceProcess::start(&db.sqlite_url(), &provider, &[], None).await;
    let mut tcp = TcpStream::connect(service.addr()).await.unwrap();
    tcp.write_all(
        b"POST /sessions/big/turns HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // No body is sent: the answer must come without it.
    let (answer, _) = read_until_closed(&mut tcp).await;
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert_eq!(
        problem_of(&answer),
        (413, "payload_too_large".to_owned()),
        "{answer}"
    );
}

#[tokio::test]
async fn json_answers_are_neither_cached_nor_sniffed() {
    let app = spawn_app(Backend::Sqlite).await;
    app.provider.enqueue([Reply::openai_text("Hello")]);
    let turn = app
        .post_turn("s-headers", serde_json::json!({"message": "Hi"}))
        .await;
    let session = app
        .client
        .get(app.url("/sessions/s-headers"))
        .send()
        .await
        .unwrap();
    let missing = app
        .client
        .get(app.url("/sessions/s-none"))
        .send()
        .await
        .unwrap();
    for response in [&turn, &session, &missing] {
        let headers = response.headers();
        assert!(
            headers["content-type"].to_str().unwrap().contains("json"),
            "{headers:?}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["cache-control"], "no-store");
    }
    assert_eq!(turn.status(), 200);
    assert_eq!(session.status(), 200);
    assert_eq!(missing.status(), 404);
}

/// With keys off (the loopback default), a page cannot drive the service:
/// a `Host` that is not a loopback name (a page that rebound its name to
/// 127.0.0.1) is 421, an `Origin` neither the service's own nor allowed is
/// 403, on every route, before anything runs. (Before, both were served.)
#[tokio::test]
async fn with_keys_off_a_foreign_host_or_origin_is_refused_on_every_route() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    let service = ServiceProcess::start(
        &db.sqlite_url(),
        &provider,
        &[("HARNESS_ALLOWED_ORIGINS", "https://app.example")],
        None,
    )
    .await;
    let addr = service.addr();
    let request = |method: &str, path: &str, headers: &str| {
        let body = r#"{"message":"hi"}"#;
        format!(
            "{method} {path} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    for (method, path) in [
        ("GET", "/healthz"),
        ("POST", "/sessions/s-edge/turns"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/mcp"),
        ("POST", "/a2a"),
    ] {
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
        ] {
            let answer = exchange(addr, &request(method, path, &format!("Host: {host}\r\n"))).await;
            assert_eq!(
                problem_of(&answer),
                (421, "host_not_allowed".to_owned()),
                "{method} {path} {host}"
            );
        }
        for origin in ["https://evil.example", "null", "http://127.0.0.1:1"] {
            let headers = format!("Host: {addr}\r\nOrigin: {origin}\r\n");
            let answer = exchange(addr, &request(method, path, &headers)).await;
            assert_eq!(
                problem_of(&answer),
                (403, "origin_not_allowed".to_owned()),
                "{method} {path} {origin}"
            );
        }
    }
    assert!(provider.requests().is_empty(), "no turn began");
    // A loopback name with any port, the service's own origin, and an
    // allowed one pass.
    let port = addr.rsplit(':').next().unwrap();
    for headers in [
        format!("Host: localhost:{port}\r\n"),
        format!("Host: [::1]:{port}\r\n"),
        format!("Host: {addr}\r\nOrigin: http://{addr}\r\n"),
        format!("Host: {addr}\r\nOrigin: https://app.example\r\n"),
    ] {
        let answer = exchange(addr, &request("GET", "/healthz", &headers)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{headers}: {answer}");
    }
}

/// `/metrics` (its `tool` labels name the inventory) can live on a
/// listener of its own, for the operator's network alone: the main
/// listener then answers it 404. (Before, only the main listener had it.)
#[tokio::test]
async fn metrics_can_be_served_on_a_listener_of_their_own() {
    let db = TestDb::new(Backend::Sqlite).await;
    let provider = FakeProvider::start().await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("service.log");
    let service = ServiceProcess::start_logging(
        &db.sqlite_url(),
        &provider,
        &[("HARNESS_METRICS_LISTEN", "127.0.0.1:0")],
        None,
        Some(&log),
    )
    .await;
    let metrics_addr = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "metrics listening")
        .and_then(|line| line["addr"].as_str().map(str::to_owned))
        .expect("a `metrics listening` log line");
    let client = reqwest::Client::new();
    let main = client.get(service.url("/metrics")).send().await.unwrap();
    assert_eq!(main.status(), 404);
    let apart = client
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(apart.status(), 200);
    assert!(
        apart.text().await.unwrap().contains("# EOF"),
        "OpenMetrics text"
    );
    let other = client
        .get(format!("http://{metrics_addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "nothing else there");
}
