"""The official MCP Python SDK (`mcp`) uses agent-harness as an MCP server.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port), connects with the
SDK's streamable HTTP client, lists the tools, calls `ask` with progress,
reads the sessions, cancels a slow `ask` (the SDK sends
`notifications/cancelled` when its call is abandoned), stops the binary.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def checks(url: str) -> int:
    async with streamable_http_client(url) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "agent-harness", init
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == {"ask", "list_sessions", "get_session"}, tools
            # The demo's vault tools write notes: `ask` is not read-only.
            assert tools["ask"].annotations.read_only_hint is False, tools["ask"]
            assert tools["get_session"].annotations.read_only_hint is True

            progress = []

            async def on_progress(done, total, message):
                progress.append((done, message))

            result = await session.call_tool(
                "ask",
                {"message": "hello mcp", "session_id": "mcp-check"},
                progress_callback=on_progress,
            )
            assert not result.is_error, result
            text = result.content[0].text
            assert text.startswith("Echo: hello mcp"), text
            assert result.structured_content["session_id"] == "mcp-check", result
            assert progress and "".join(m for _, m in progress) == text, progress
            assert [d for d, _ in progress] == sorted(d for d, _ in progress), progress

            listed = await session.call_tool("list_sessions", {})
            ids = [s["session_id"] for s in listed.structured_content["sessions"]]
            assert "mcp-check" in ids, listed
            got = await session.call_tool("get_session", {"session_id": "mcp-check"})
            assert got.structured_content["session"]["turn_count"] == 1, got
            assert got.structured_content["messages"][-1]["content"] == text, got

            # Abandoned while the model is slow: the SDK says
            # notifications/cancelled, and the turn ends cancelled (it
            # adds nothing to the history).
            with anyio.move_on_after(1.0):
                await session.call_tool(
                    "ask", {"message": "answer slowly", "session_id": "mcp-cancel"}
                )
                raise AssertionError("the slow ask answered within a second")
            for _ in range(100):
                got = await session.call_tool("get_session", {"session_id": "mcp-cancel"})
                if got.structured_content["session"]["running_turn_id"] is None:
                    break
                await anyio.sleep(0.05)
            session_view = got.structured_content
            assert session_view["session"]["running_turn_id"] is None, session_view
            assert session_view["messages"] == [], session_view
    return 4


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
        }
        server = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            passed = anyio.run(checks, f"http://127.0.0.1:{port}/mcp")
            print(f"mcp-sdk: {passed} passed, 0 failed")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main(sys.argv[1])
