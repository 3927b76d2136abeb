"""Webhooks of agent-harness, verified by the official libraries.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port) with the operator's
endpoint (HARNESS_WEBHOOK_URL, HARNESS_WEBHOOK_SECRET) on a local
receiver that is down at first, registers a tenant endpoint with
`POST /webhooks`, runs turns (one that ends, one that waits for an
approval, a background response), then brings the receiver up. Every
event must arrive at least once, each under one stable `webhook-id`, and
every delivery must pass the `openai` SDK's `client.webhooks.unwrap` and
`standardwebhooks`' `Webhook.verify` with its endpoint's secret, while a
delivery with one byte changed fails both.
"""

import http.server
import json
import socket
import sys
import threading
import time
import urllib.request

import openai
import standardwebhooks
from openai import OpenAI

import service

OPERATOR_SECRET = "whsec_" + "c2VjcmV0LW9mLXRoZS1vcGVyYXRvci1mb3ItY2k="  # 29 bytes


class Receiver(http.server.BaseHTTPRequestHandler):
    """Records each POST; answers 503 while `down`."""

    seen: list = []
    down = True

    def do_POST(self):  # noqa: N802 (the library's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        Receiver.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(503 if Receiver.down else 204)
        self.end_headers()

    def log_message(self, *_):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, body=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{base}{path}", data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
        return json.loads(text) if text else {}


def main(binary: str) -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver = f"http://127.0.0.1:{port}"
    with service.running(
        binary,
        HARNESS_WEBHOOK_URL=f"{receiver}/operator",
        HARNESS_WEBHOOK_SECRET=OPERATOR_SECRET,
        HARNESS_OUTBOUND_ALLOW_PRIVATE="true",
        HARNESS_APPROVAL_REQUIRED="LOCAL_WRITE",
    ) as base:
        made = call(base, "POST", "/webhooks", {"url": f"{receiver}/tenant", "events": ["turn.completed", "turn.waiting"]})
        secrets = {"/operator": OPERATOR_SECRET, "/tenant": made["secret"]}
        ended = call(base, "POST", "/sessions/hooks-1/turns", {"message": "hello hooks"})
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        background = client.responses.create(model="agent-harness", input="hello background", background=True)
        # A write that waits for a person (the native route, streamed:
        # the stream is read until the request, then the approval ends it).
        request = urllib.request.Request(
            f"{base}/sessions/hooks-2/turns",
            data=json.dumps({"message": "write a note about Lyon"}).encode(),
            headers={"content-type": "application/json", "accept": "text/event-stream"},
        )
        with urllib.request.urlopen(request, timeout=30) as stream:
            waiting_turn = stream.headers["x-turn-id"]
            for line in stream:
                if line.startswith(b"event: approval.requested"):
                    break
        # The receiver is down for a while: every delivery fails at first.
        time.sleep(3)
        assert Receiver.seen, "nothing was tried while the receiver was down"
        assert all(path in secrets for path, _, _ in Receiver.seen), Receiver.seen
        Receiver.down = False

        def kinds(path: str) -> dict:
            out = {}
            for at, headers, body in Receiver.seen:
                if at == path:
                    out.setdefault(json.loads(body)["type"], []).append((headers, body))
            return out

        wanted_operator = {"turn.completed", "turn.waiting", "response.completed"}
        wanted_tenant = {"turn.completed", "turn.waiting"}
        for _ in range(400):
            if wanted_operator <= set(kinds("/operator")) and wanted_tenant <= set(kinds("/tenant")):
                break
            time.sleep(0.05)
        assert wanted_operator <= set(kinds("/operator")), kinds("/operator").keys()
        assert wanted_tenant <= set(kinds("/tenant")), kinds("/tenant").keys()
        # Approved, the waiting turn ends: said too.
        [(_, body)] = kinds("/tenant")["turn.waiting"][-1:]
        answer = json.loads(body)["data"]["answer"]
        call(base, "POST", answer["path"], answer["body"])
        for _ in range(400):
            done = [json.loads(b)["data"]["turn_id"] for _, b in kinds("/tenant").get("turn.completed", [])]
            if waiting_turn in done:
                break
            time.sleep(0.05)
        assert waiting_turn in done, done
        assert ended["turn_id"] in done, done
        response_ids = [json.loads(b)["data"]["id"] for _, b in kinds("/operator")["response.completed"]]
        assert background.id in response_ids, (background.id, response_ids)

    server.shutdown()
    checked = 0
    by_id: dict = {}
    for path, headers, body in Receiver.seen:
        secret = secrets[path]
        event = client.webhooks.unwrap(body, headers, secret=secret)
        assert event.type == json.loads(body)["type"], event
        standardwebhooks.Webhook(secret).verify(body, headers)
        tampered = body.replace(b'"', b"'", 1)
        for verify in (
            lambda: client.webhooks.unwrap(tampered, headers, secret=secret),
            lambda: standardwebhooks.Webhook(secret).verify(tampered, headers),
        ):
            try:
                verify()
                raise AssertionError("a changed delivery was taken")
            except (openai.InvalidWebhookSignatureError, standardwebhooks.webhooks.WebhookVerificationError):
                pass
        # One id, one message: every try of it the same.
        by_id.setdefault((path, headers["webhook-id"]), set()).add(body)
        checked += 1
    assert all(len(bodies) == 1 for bodies in by_id.values()), by_id
    retried = sum(1 for (path, _), _ in by_id.items()) < checked
    assert retried, "no delivery was tried twice"
    print(f"webhooks: {checked} deliveries verified by openai and standardwebhooks, {len(by_id)} messages")


if __name__ == "__main__":
    main(sys.argv[1])
