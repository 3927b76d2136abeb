#!/usr/bin/env python3
"""Time from the provider's first text chunk to the client's first `message.delta`.

Starts a fake OpenAI-compatible provider (replaying tests/fixtures/openai/text.sse)
in this process, points a running agent-harness at it, and measures per turn the
time between the provider writing its first content chunk and the client reading
the first `message.delta` event. The same client reading the provider directly
gives the baseline; the difference is what agent-harness adds.

Usage:
  scripts/first_delta_latency.py --serve-provider 127.0.0.1:18500 &   # or let it start one
  OPENAI_BASE_URL=http://127.0.0.1:18500/v1 target/release/agent-harness &
  scripts/first_delta_latency.py --harness 127.0.0.1:8080 --provider 127.0.0.1:18500 -n 300
"""

import argparse
import http.server
import json
import os
import socket
import statistics
import threading
import time

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "openai", "text.sse")
EVENTS = [e + "\n\n" for e in open(FIXTURE).read().split("\n\n") if e.strip()]
FIRST_TEXT = 1  # EVENTS[0] carries the role, EVENTS[1] the first text
STAMPS = {}


class Provider(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        tag = body.get("user") or next(
            (line.split(": ", 1)[1] for m in body["messages"] for line in m["content"].splitlines()
             if line.startswith("- session_id: ")), "direct")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.write(EVENTS[0].encode())
            self.wfile.flush()
            STAMPS[tag] = time.perf_counter()
            for event in EVENTS[FIRST_TEXT:]:
                self.wfile.write(event.encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the direct client hangs up once it has its first chunk


def read_until(sock, marker, data=b""):
    """Reads until `marker` has arrived; returns the time and all data read."""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("closed before %r" % marker)
        data += chunk
    return time.perf_counter(), data


def post(addr, path, body, accept):
    host, port = addr.split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = json.dumps(body).encode()
    sock.sendall(
        b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\naccept: %s\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s"
        % (path.encode(), addr.encode(), accept.encode(), len(payload), payload))
    return sock


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve-provider", help="only run the fake provider on host:port")
    ap.add_argument("--harness", default="127.0.0.1:8080")
    ap.add_argument("--provider", default="127.0.0.1:18500")
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    if args.serve_provider:
        host, port = args.serve_provider.split(":")
        http.server.ThreadingHTTPServer((host, int(port)), Provider).serve_forever()
        return
    host, port = args.provider.split(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    direct, harness = [], []
    for i in range(args.n):
        tag = "direct-%d" % i
        sock = post(args.provider, "/v1/chat/completions", {"user": tag, "messages": []}, "text/event-stream")
        t1, _ = read_until(sock, b'"content":"Hello"')
        direct.append((t1 - STAMPS[tag]) * 1000)
        sock.close()

        tag = "lat-%d-%d" % (os.getpid(), i)
        sock = post(args.harness, "/sessions/%s/turns" % tag, {"message": "Hi"}, "text/event-stream")
        t1, data = read_until(sock, b"event: message.delta")
        harness.append((t1 - STAMPS[tag]) * 1000)
        read_until(sock, b"event: turn.completed", data)
        sock.close()

    for name, values in (("provider -> client, direct", direct), ("provider -> client, through agent-harness", harness)):
        print("%-44s p50 %.3f ms  p99 %.3f ms  mean %.3f ms" % (
            name, percentile(values, 50), percentile(values, 99), statistics.mean(values)))
    print("%-44s p50 %.3f ms  p99 %.3f ms" % (
        "added by agent-harness", percentile(harness, 50) - percentile(direct, 50),
        percentile(harness, 99) - percentile(direct, 99)))


if __name__ == "__main__":
    main()
