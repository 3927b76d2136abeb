"""The official `openai` SDK calls agent-harness's /v1/chat/completions.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port), makes one JSON and one
streamed completion with the SDK, checks what comes back, stops the binary.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

from openai import OpenAI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(binary: str) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HARNESS_PROVIDERS": "demo:echo",
            "HARNESS_LISTEN": f"127.0.0.1:{port}",
            "DATABASE_URL": f"sqlite://{folder}/h.db",
            "HARNESS_VAULT_DIR": f"{folder}/vault",
            "HARNESS_LOG_FORMAT": "json",
            # Keep-alive comments every second: the slow answer below
            # waits 2.5 s for its first word, so the SDK reads some.
            "HARNESS_SSE_KEEPALIVE_S": "1",
        }
        server = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
            answer = client.chat.completions.create(
                model="agent-harness",
                messages=[{"role": "user", "content": "hello sdk"}],
            )
            assert answer.choices[0].message.content.startswith("Echo: hello sdk"), answer
            assert answer.usage.total_tokens > 0, answer
            text, usage = "", None
            for chunk in client.chat.completions.create(
                model="agent-harness",
                messages=[{"role": "user", "content": "stream please"}],
                stream=True,
                stream_options={"include_usage": True},
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage:
                    usage = chunk.usage
            assert text.startswith("Echo: stream please"), text
            assert usage is not None and usage.total_tokens > 0, usage
            # A quiet stream: keep-alive comments, which the SDK skips.
            started = time.monotonic()
            text = ""
            for chunk in client.chat.completions.create(
                model="agent-harness",
                messages=[{"role": "user", "content": "answer slowly"}],
                stream=True,
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            assert text.startswith("Echo: answer slowly"), text
            assert time.monotonic() - started >= 2.0, "the answer was not slow"
            print("openai-sdk: 3 passed, 0 failed")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main(sys.argv[1])
