"""The official MCP Python SDK (`mcp`) uses agent-harness as an MCP server.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port), connects with the
SDK's streamable HTTP client, lists the tools, calls `ask` with progress,
reads the sessions, cancels a slow `ask` (the SDK sends
`notifications/cancelled` when its call is abandoned); then, as a
2026-07-28 client (`Client`, which discovers the version) with the tasks
extension (`io.modelcontextprotocol/tasks`, written here against the SDK's
`ClientExtension` interface, as the SDK ships no tasks client), runs `ask`
as a task polled to its end and cancels another. Against a second binary
whose writes wait for approval, a write is approved through the SDK's
elicitation callback: as `elicitation/create` on the call's stream
(2025-11-25) and as an input-required result (2026-07-28). Stops the
binaries.
"""

import sys
from typing import Any, Literal

import anyio
from mcp import Client, ClientSession
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ElicitResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field, TypeAdapter

import service

TASKS = "io.modelcontextprotocol/tasks"


class TaskCreated(Result):
    """What `tools/call` answers a client of the tasks extension: a task."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


ANY = TypeAdapter(dict[str, Any])


class Tasks(ClientExtension):
    """The tasks extension: a task `tools/call` answers is polled with
    `tasks/get` until it ends, and its result is the call's."""

    identifier = TASKS

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def claims(self):
        return (ResultClaim(result_type="task", model=TaskCreated, resolve=self.finish),)

    async def finish(self, created: TaskCreated, ctx: ClaimContext) -> CallToolResult:
        for _ in range(400):
            got = await ctx.session.send_request(GetTask(params=TaskParams(taskId=created.task_id)), ANY)
            self.seen.append((created.task_id, got["status"]))
            if got["status"] != "working":
                return CallToolResult.model_validate(got["result"])
            await anyio.sleep(0.05)
        raise AssertionError(f"task {created.task_id} still working")


async def task_checks(url: str) -> int:
    tasks = Tasks()
    async with Client(url, extensions=[tasks]) as client:
        assert client.session.protocol_version == "2026-07-28", client.session.protocol_version
        result = await client.call_tool("ask", {"message": "answer slowly", "session_id": "mcp-task"})
        assert not result.is_error and result.content[0].text.startswith("Echo: answer slowly"), result
        statuses = [status for _, status in tasks.seen]
        assert statuses[0] == "working" and statuses[-1] == "completed", statuses
        session = client.session
        # A second, cancelled while it works.
        created = await session.call_tool(
            "ask", {"message": "answer slowly", "session_id": "mcp-task-cancel"}, allow_claimed=True
        )
        assert isinstance(created, TaskCreated) and created.status == "working", created
        await session.send_request(CancelTask(params=TaskParams(taskId=created.task_id)), ANY)
        for _ in range(100):
            got = await session.send_request(GetTask(params=TaskParams(taskId=created.task_id)), ANY)
            if got["status"] != "working":
                break
            await anyio.sleep(0.05)
        assert got["status"] == "cancelled", got
    return 2


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


async def approval_checks(url: str) -> int:
    """A write that waits for a person, approved by the SDK's elicitation
    callback in both versions."""
    asked = []

    async def approve(context, params) -> ElicitResult:
        asked.append(params.message)
        assert params.requested_schema["required"] == ["approve"], params
        return ElicitResult(action="accept", content={"approve": True})

    async with streamable_http_client(url) as streams:
        async with ClientSession(streams[0], streams[1], elicitation_callback=approve) as session:
            await session.initialize()
            result = await session.call_tool("ask", {"message": "write a note about Lyon", "session_id": "mcp-write"})
            assert not result.is_error, result
            assert result.content[0].text.startswith("The note tool said"), result
    assert len(asked) == 1 and "write_note" in asked[0], asked

    async with Client(url, elicitation_callback=approve) as client:
        assert client.session.protocol_version == "2026-07-28", client.session.protocol_version
        result = await client.call_tool("ask", {"message": "write a note about Nice", "session_id": "mcp-write-2026"})
        assert not result.is_error, result
        assert result.content[0].text.startswith("The note tool said"), result
    assert len(asked) == 2, asked
    return 2


def main(binary: str) -> None:
    with service.running(binary) as base:
        passed = anyio.run(checks, f"{base}/mcp")
        passed += anyio.run(task_checks, f"{base}/mcp")
    with service.running(binary, HARNESS_APPROVAL_REQUIRED="LOCAL_WRITE") as base:
        passed += anyio.run(approval_checks, f"{base}/mcp")
    print(f"mcp-sdk: {passed} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
