"""The official MCP Python SDK (`mcp`) uses agent-harness as an MCP server.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port), connects with the
SDK's streamable HTTP client, lists the tools, calls `ask` with progress,
reads the sessions, cancels a slow `ask` (the SDK sends
`notifications/cancelled` when its call is abandoned), stops the binary.
"""

import sys

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import service


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
    with service.running(binary) as base:
        passed = anyio.run(checks, f"{base}/mcp")
        print(f"mcp-sdk: {passed} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
