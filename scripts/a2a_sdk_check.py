"""The official A2A Python SDK (`a2a-sdk`) delegates to agent-harness.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port, an approval asked for
note writes), resolves the agent card, then sends (blocking and streamed;
an image as a raw file part, a ZIP refused),
gets, lists, cancels and subscribes, and answers an approval that puts a
task in `input-required` with a second message in the same task, runs
a tool of its own the task asks it to call, and has a task's updates
pushed to a webhook of its own. Every
body the service answered is parsed again, strictly, by the SDK's own
protobuf types: an unknown field fails.
"""

import http.server
import json
import sys
import threading
import time

import anyio
import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as a2a
from google.protobuf import empty_pb2, json_format
from google.protobuf.struct_pb2 import Struct

import service


class Tee(httpx.AsyncBaseTransport):
    """Keeps every request's method and the bytes of its answer."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[tuple[str, bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        method = body.get("method", request.url.path)
        response = await self.inner.handle_async_request(request)
        seen = self.seen

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self):
                buffer = bytearray()
                async for chunk in response.stream:
                    buffer.extend(chunk)
                    yield chunk
                seen.append((method, bytes(buffer)))

            async def aclose(self) -> None:
                await response.stream.aclose()

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=Stream(),
            extensions=response.extensions,
        )


RESULT_TYPES = {
    "SendMessage": a2a.SendMessageResponse,
    "SendStreamingMessage": a2a.StreamResponse,
    "SubscribeToTask": a2a.StreamResponse,
    "GetTask": a2a.Task,
    "CancelTask": a2a.Task,
    "ListTasks": a2a.ListTasksResponse,
    "CreateTaskPushNotificationConfig": a2a.TaskPushNotificationConfig,
    "GetTaskPushNotificationConfig": a2a.TaskPushNotificationConfig,
    "ListTaskPushNotificationConfigs": a2a.ListTaskPushNotificationConfigsResponse,
    "DeleteTaskPushNotificationConfig": empty_pb2.Empty,
}


class Webhook:
    """A push receiver on loopback: keeps each POST's headers and body."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {name.lower(): value for name, value in self.headers.items()}
                received.append((headers, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    async def until_state(self, state: int, seconds: float = 20) -> list:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _, body in self.received:
                update = json_format.ParseDict(body, a2a.StreamResponse())
                if update.HasField("status_update") and update.status_update.status.state == state:
                    return self.received
            await anyio.sleep(0.1)
        raise AssertionError(f"no push said {state}: {self.received}")

    async def until_task(self, task_id: str, seconds: float = 10) -> list:
        """Waits for a push that names `task_id` (the task, or an update)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _, body in self.received:
                named = {
                    body.get("task", {}).get("id"),
                    body.get("statusUpdate", {}).get("taskId"),
                    body.get("artifactUpdate", {}).get("taskId"),
                }
                if task_id in named:
                    return self.received
            await anyio.sleep(0.05)
        raise AssertionError(f"no push named {task_id}: {self.received}")


def strictly_parsed(seen: list[tuple[str, bytes]]) -> int:
    """Parses every answer with `ignore_unknown_fields=False`."""
    count = 0
    for method, body in seen:
        text = body.decode()
        if method.endswith("agent-card.json"):
            json_format.ParseDict(json.loads(text), a2a.AgentCard())
            count += 1
            continue
        if method.startswith("/"):
            continue
        payloads = (
            [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
            if "data: " in text
            else [text]
        )
        for payload in payloads:
            message = json.loads(payload)
            if "error" in message:
                continue
            json_format.ParseDict(message["result"], RESULT_TYPES[method]())
            count += 1
    return count


def user_message(text: str, **ids) -> a2a.Message:
    return a2a.Message(message_id=f"m-{time.monotonic_ns()}", role=a2a.ROLE_USER, parts=[a2a.Part(text=text)], **ids)


async def collect(stream) -> list:
    return [event async for event in stream]


async def checks(base: str, tee: Tee) -> int:
    http = httpx.AsyncClient(transport=tee, timeout=30)
    blocking = await create_client(base, ClientConfig(streaming=False, httpx_client=http))
    streaming = await create_client(base, ClientConfig(streaming=True, httpx_client=http))
    card = blocking._card  # the resolved card
    assert card.name == "agent-harness" and card.capabilities.streaming, card

    # Blocking send: the task, completed, its answer an artifact.
    [answer] = await collect(blocking.send_message(a2a.SendMessageRequest(message=user_message("hello a2a"))))
    task = answer.task
    assert task.status.state == a2a.TASK_STATE_COMPLETED, task
    assert task.artifacts[0].parts[0].text.startswith("Echo: hello a2a"), task
    context = task.context_id

    # A file part (raw bytes, image/png): the model is shown it (the demo
    # says what it got); a ZIP is ContentTypeNotSupportedError.
    png = b"\x89PNG\r\n\x1a\n" + bytes(100)
    image = a2a.Message(
        message_id=f"m-{time.monotonic_ns()}",
        role=a2a.ROLE_USER,
        parts=[a2a.Part(text="what is this?"), a2a.Part(raw=png, media_type="image/png", filename="a.png")],
    )
    [seen] = await collect(blocking.send_message(a2a.SendMessageRequest(message=image)))
    said = seen.task.artifacts[0].parts[0].text
    assert f"[attached image/png, {len(png)} bytes]" in said, said
    archive = a2a.Message(
        message_id=f"m-{time.monotonic_ns()}",
        role=a2a.ROLE_USER,
        parts=[a2a.Part(text="unpack"), a2a.Part(raw=b"PK\x03\x04zip", media_type="application/zip")],
    )
    try:
        await collect(blocking.send_message(a2a.SendMessageRequest(message=archive)))
        raise AssertionError("a ZIP part was taken")
    except Exception as refused:  # the SDK's error of the JSON-RPC answer
        assert "-32005" in repr(refused) or "ContentTypeNotSupported" in repr(refused), repr(refused)

    # Streamed, in the same context: the task, its chunks, completed.
    events = await collect(
        streaming.send_message(a2a.SendMessageRequest(message=user_message("stream please", context_id=context)))
    )
    assert events[0].HasField("task"), events[0]
    text = "".join(
        p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts if p.text
    )
    assert text.startswith("Echo: stream please"), text
    assert events[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED, events[-1]
    second = events[0].task.id

    # Get (with a history of one) and list the context's tasks, paged.
    got = await blocking.get_task(a2a.GetTaskRequest(id=second, history_length=1))
    assert got.status.state == a2a.TASK_STATE_COMPLETED and len(got.history) == 1, got
    page = await blocking.list_tasks(a2a.ListTasksRequest(context_id=context, page_size=1))
    assert [t.id for t in page.tasks] == [second] and page.next_page_token, page
    rest = await blocking.list_tasks(
        a2a.ListTasksRequest(context_id=context, page_size=1, page_token=page.next_page_token)
    )
    assert [t.id for t in rest.tasks] == [task.id] and not rest.next_page_token, rest

    # Cancel a slow one, at once; an ended one cannot be.
    [started] = await collect(
        blocking.send_message(
            a2a.SendMessageRequest(
                message=user_message("answer slowly"),
                configuration=a2a.SendMessageConfiguration(return_immediately=True),
            )
        )
    )
    assert started.task.status.state == a2a.TASK_STATE_WORKING, started
    # Subscribed while it runs: the task as it stands first.
    subscribed = streaming.subscribe(a2a.SubscribeToTaskRequest(id=started.task.id))
    first = await subscribed.__anext__()
    assert first.HasField("task") and first.task.id == started.task.id, first
    cancelled = await blocking.cancel_task(a2a.CancelTaskRequest(id=started.task.id))
    assert cancelled.status.state == a2a.TASK_STATE_CANCELED, cancelled
    tail = [e async for e in subscribed]
    assert tail[-1].status_update.status.state == a2a.TASK_STATE_CANCELED, tail
    try:
        await blocking.cancel_task(a2a.CancelTaskRequest(id=task.id))
        raise AssertionError("an ended task was canceled")
    except Exception as e:  # the SDK's TaskNotCancelableError
        assert type(e).__name__ == "TaskNotCancelableError", e

    # An approval: input-required, answered in the same task.
    [asked] = await collect(
        blocking.send_message(a2a.SendMessageRequest(message=user_message("search my notes for Paris")))
    )
    assert asked.task.status.state == a2a.TASK_STATE_INPUT_REQUIRED, asked
    assert "approve" in asked.task.status.message.parts[0].text, asked
    events = await collect(
        streaming.send_message(
            a2a.SendMessageRequest(
                message=user_message("approve", task_id=asked.task.id, context_id=asked.task.context_id)
            )
        )
    )
    assert events[0].HasField("task"), events[0]
    assert events[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED, events[-1]

    # A write that waits for approval, approved the same way: the note is
    # written and the answer says so.
    [asked] = await collect(
        blocking.send_message(a2a.SendMessageRequest(message=user_message("write a note about Paris")))
    )
    assert asked.task.status.state == a2a.TASK_STATE_INPUT_REQUIRED, asked
    assert "write_note" in asked.task.status.message.parts[0].text, asked
    [written] = await collect(
        blocking.send_message(
            a2a.SendMessageRequest(
                message=user_message("approve", task_id=asked.task.id, context_id=asked.task.context_id)
            )
        )
    )
    assert written.task.status.state == a2a.TASK_STATE_COMPLETED, written
    said = " ".join(p.text for a in written.task.artifacts for p in a.parts)
    assert "The note tool said" in said, written

    # A tool the client runs (the card's extension): input-required with
    # the call as a data part, answered by a data part in the same task.
    [extension] = card.capabilities.extensions
    assert extension.uri == "urn:agent-harness:a2a:client-tools:v1", extension
    metadata = Struct()
    metadata.update({"clientTools": [{
        "name": "get_location",
        "description": "Where the user is, from the device",
        "parameters": {"type": "object", "properties": {}},
        "effect": "READ_ONLY",
    }]})
    [asked] = await collect(
        blocking.send_message(a2a.SendMessageRequest(message=user_message("where am I?"), metadata=metadata))
    )
    # The service asks approval for every tool here: the client's own too.
    assert asked.task.status.state == a2a.TASK_STATE_INPUT_REQUIRED, asked
    assert "approve" in asked.task.status.message.parts[0].text, asked
    [asked] = await collect(
        blocking.send_message(
            a2a.SendMessageRequest(
                message=user_message("approve", task_id=asked.task.id, context_id=asked.task.context_id)
            )
        )
    )
    assert asked.task.status.state == a2a.TASK_STATE_INPUT_REQUIRED, asked
    call = json_format.MessageToDict(asked.task.status.message.parts[1].data)
    assert call["tool"] == "get_location" and call["runs"] == "client", call
    result = json_format.ParseDict({"data": {"call_id": call["call_id"], "output": "Lyon, France"}}, a2a.Part())
    answer = a2a.Message(
        message_id=f"m-{time.monotonic_ns()}",
        role=a2a.ROLE_USER,
        parts=[result],
        task_id=asked.task.id,
        context_id=asked.task.context_id,
    )
    events = await collect(streaming.send_message(a2a.SendMessageRequest(message=answer)))
    assert events[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED, events[-1]
    done = await blocking.get_task(a2a.GetTaskRequest(id=asked.task.id))
    text = done.artifacts[0].parts[0].text
    assert text.startswith("Your tool answered") and "Lyon, France" in text, done

    # Push notifications: a configuration for a slow task; its updates
    # reach the webhook with the token and credentials, each a
    # StreamResponse the SDK parses strictly.
    webhook = Webhook()
    [slow] = await collect(
        blocking.send_message(
            a2a.SendMessageRequest(
                message=user_message("answer slowly, push me"),
                configuration=a2a.SendMessageConfiguration(return_immediately=True),
            )
        )
    )
    assert card.capabilities.push_notifications, card
    made = await blocking.create_task_push_notification_config(
        a2a.TaskPushNotificationConfig(
            task_id=slow.task.id,
            id="hook-1",
            url=webhook.url,
            token="task-token",
            authentication=a2a.AuthenticationInfo(scheme="Bearer", credentials="s3cret"),
        )
    )
    assert made.id == "hook-1" and made.url == webhook.url, made
    got = await blocking.get_task_push_notification_config(
        a2a.GetTaskPushNotificationConfigRequest(task_id=slow.task.id, id="hook-1")
    )
    assert got.token == "task-token", got
    listed = await blocking.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=slow.task.id)
    )
    assert [c.id for c in listed.configs] == ["hook-1"], listed
    pushes = await webhook.until_state(a2a.TASK_STATE_COMPLETED)
    for headers, body in pushes:
        assert headers["authorization"] == "Bearer s3cret", headers
        assert headers["x-a2a-notification-token"] == "task-token", headers
        json_format.ParseDict(body, a2a.StreamResponse(), ignore_unknown_fields=False)
    await blocking.delete_task_push_notification_config(
        a2a.DeleteTaskPushNotificationConfigRequest(task_id=slow.task.id, id="hook-1")
    )
    listed = await blocking.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=slow.task.id)
    )
    assert not listed.configs, listed

    # The TCK's flow of a streaming send whose configuration carries a
    # push configuration, with a receiver of its own (issue 63): the
    # stream's first event is the task; the stream is left there; the
    # configuration is the task's, and its pushes name that task. (The
    # TCK's receiver is shared by its tests: its wait returns on an
    # earlier test's push, and it then looks for this task's before the
    # first one could arrive.)
    streamed_hook = Webhook()
    stream = streaming.send_message(
        a2a.SendMessageRequest(
            message=user_message("push me while streaming"),
            configuration=a2a.SendMessageConfiguration(
                task_push_notification_config=a2a.TaskPushNotificationConfig(
                    url=streamed_hook.url, token="stream-token"
                )
            ),
        )
    )
    first = await stream.__anext__()
    await stream.aclose()
    streamed_task = first.task.id
    assert streamed_task, first
    listed = await blocking.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=streamed_task)
    )
    assert [c.url for c in listed.configs] == [streamed_hook.url], listed
    pushed = await streamed_hook.until_task(streamed_task)
    for headers, body in pushed:
        assert headers["x-a2a-notification-token"] == "stream-token", headers
        json_format.ParseDict(body, a2a.StreamResponse(), ignore_unknown_fields=False)
    streamed_hook.server.shutdown()
    webhook.server.shutdown()
    await http.aclose()
    return 13


def main(binary: str) -> None:
    # The demo's search and its note writes ask for approval: tasks that
    # wait.
    # The webhook of the push round trip is on loopback.
    with service.running(
        binary, HARNESS_APPROVAL_REQUIRED="READ_ONLY,LOCAL_WRITE", HARNESS_OUTBOUND_ALLOW_PRIVATE="true"
    ) as base:
        tee = Tee()
        passed = anyio.run(checks, base, tee)
        parsed = strictly_parsed(tee.seen)
        assert parsed >= 10, tee.seen
        print(f"a2a-sdk: {passed + 1} passed, 0 failed ({parsed} answers parsed strictly)")


if __name__ == "__main__":
    main(sys.argv[1])
