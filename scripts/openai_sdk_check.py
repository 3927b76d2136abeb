"""The official `openai` SDK calls agent-harness's /v1/chat/completions and
/v1/responses.

Run by .ci/run after `cargo test`: starts the binary given (the `demo`
provider, a fresh SQLite file, a free loopback port), makes JSON and
streamed completions and responses with the SDK (a function tool the
client runs among them, and a write that waits for approval, answered
with `mcp_approval_response`, streamed and not; files uploaded, read and deleted through
`client.files`, an image and a PDF by file id in a response and an image
as a data URL in a completion, shown to the model; structured output
parsed into a pydantic model by `responses.parse` and
`chat.completions.parse`, repaired, or incomplete; every stream event of a
response validated by the SDK's own `ResponseStreamEvent` union, so an
event of no documented type, or one missing a field, fails), checks what
comes back, stops the binary.
"""

import base64
import sys
import time

import openai
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

import service

# Every stream event, as the SDK's typed models define them (validated,
# not just constructed: a missing field or an unknown type fails).
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


def typed_events(stream) -> list:
    """The events of a Responses stream, each validated by the SDK's union."""
    events = []
    for event in stream:
        checked = STREAM_EVENT.validate_python(event.to_dict())
        assert type(checked) is type(event), (type(checked), event)
        events.append(event)
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)), numbers
    return events


def text_of(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def responses_checks(client: OpenAI) -> int:
    """The Responses API through `client.responses`; how many checks ran."""
    # Plain, then chained by `previous_response_id`.
    first = client.responses.create(model="agent-harness", input="hello responses")
    assert first.status == "completed", first
    assert first.output_text.startswith("Echo: hello responses"), first.output_text
    assert first.usage is not None and first.usage.total_tokens > 0, first.usage
    second = client.responses.create(
        model="agent-harness", input="and again", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id, second
    assert second.conversation.id == first.conversation.id, second
    assert second.output_text.startswith("Echo: and again"), second.output_text
    # Its input items: what it read of the chain, then what it was asked
    # (newest first).
    items = list(client.responses.input_items.list(second.id))
    assert [i.content[0].text for i in items] == [
        "and again",
        first.output_text,
        "hello responses",
    ], items

    # A branch: a response that follows the second of four goes on from
    # there, as OpenAI's chain does: the model is sent the first two
    # exchanges, never the third or the fourth (the demo says back what it
    # was sent), and its input items are that branch.
    chain = []
    for said in ["alpha", "beta", "gamma", "delta"]:
        follows = {"previous_response_id": chain[-1].id} if chain else {}
        chain.append(client.responses.create(model="agent-harness", input=said, **follows))
    branched = client.responses.create(
        model="agent-harness", input="what did I say?", previous_response_id=chain[1].id
    )
    assert branched.previous_response_id == chain[1].id, branched
    assert branched.output_text == "You said: alpha | beta (2 answers heard)", branched.output_text
    items = list(client.responses.input_items.list(branched.id, order="asc"))
    assert [i.content[0].text for i in items] == [
        "alpha",
        chain[0].output_text,
        "beta",
        chain[1].output_text,
        "what did I say?",
    ], items
    # The chain's own end is where it was: the fourth goes on from the third.
    after = client.responses.create(
        model="agent-harness", input="what did I say?", previous_response_id=chain[3].id
    )
    assert (
        after.output_text == "You said: alpha | beta | gamma | delta (4 answers heard)"
    ), after.output_text

    # Streamed, every event typed; then a tool turn, its call an mcp_call.
    events = typed_events(
        client.responses.create(model="agent-harness", input="stream please", stream=True)
    )
    assert events[0].type == "response.created", events[0]
    assert events[-1].type == "response.completed", events[-1]
    assert text_of(events).startswith("Echo: stream please"), text_of(events)
    assert events[-1].response.output_text == text_of(events)
    events = typed_events(
        client.responses.create(
            model="agent-harness", input="search my notes for Paris", stream=True
        )
    )
    calls = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"]
    assert calls and calls[0].name == "local_search", events
    assert any(e.type == "response.mcp_call.completed" for e in events), events

    # In the background: retrieved, then its stream resumed after an event.
    started = client.responses.create(
        model="agent-harness", input="answer slowly please", background=True
    )
    assert started.status in ("queued", "in_progress"), started
    whole = typed_events(client.responses.retrieve(started.id, stream=True))
    assert whole[-1].type == "response.completed", whole[-1]
    done = client.responses.retrieve(started.id)
    assert done.status == "completed" and done.output_text == text_of(whole), done
    after = whole[5].sequence_number
    rest = typed_events(client.responses.retrieve(started.id, stream=True, starting_after=after))
    assert [e.to_dict() for e in rest] == [e.to_dict() for e in whole[6:]], rest

    # Cancelled while it waits for the model; deleted after.
    slow = client.responses.create(
        model="agent-harness", input="answer slowly, then stop", background=True
    )
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled", cancelled
    client.responses.delete(slow.id)
    try:
        client.responses.retrieve(slow.id)
        raise AssertionError("a deleted response is still there")
    except openai.NotFoundError:
        pass

    # Steered: a request that follows the response in progress with
    # `metadata.multitask: "steer"`. Its message joins that turn (the step
    # after the search answers it: the demo echoes the last user message
    # it is sent), and its answer is the rest of the turn, a response of
    # its own.
    running = client.responses.create(
        model="agent-harness", input="search my notes slowly", background=True
    )
    steered = client.responses.create(
        model="agent-harness",
        input="also say Madrid",
        previous_response_id=running.id,
        metadata={"multitask": "steer"},
    )
    assert steered.status == "completed", steered
    assert steered.id.startswith(running.id + "_"), steered.id
    assert steered.output_text.startswith("Echo: also say Madrid"), steered.output_text
    whole = client.responses.retrieve(running.id)
    assert whole.output_text.startswith("Echo: also say Madrid"), whole.output_text
    assert any(item.type == "mcp_call" for item in whole.output), whole.output
    return 9 + client_tool_checks(client)


LOCATION = {
    "type": "function",
    "name": "get_location",
    "description": "Where the user is, from the device",
    "parameters": {"type": "object", "properties": {}},
}


def client_tool_checks(client: OpenAI) -> int:
    """A function tool the client runs: the response ends at its call,
    the next request answers it, and the same turn goes on."""
    asked = client.responses.create(model="agent-harness", input="where am I?", tools=[LOCATION])
    assert asked.status == "completed", asked
    [call] = [o for o in asked.output if o.type == "function_call"]
    assert call.name == "get_location" and call.arguments == "{}", call
    assert [t.name for t in asked.tools] == ["get_location"], asked.tools
    answered = client.responses.create(
        model="agent-harness",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Lyon, France"}],
        tools=[LOCATION],
    )
    assert answered.status == "completed", answered
    assert answered.previous_response_id == asked.id, answered
    assert answered.output_text.startswith("Your tool answered"), answered.output_text
    assert "Lyon, France" in answered.output_text, answered.output_text
    # Both responses stay what they were.
    assert client.responses.retrieve(asked.id).output[-1].type == "function_call"
    assert client.responses.retrieve(answered.id).output_text == answered.output_text

    # Streamed: the call as typed events, then the answer streamed.
    events = typed_events(
        client.responses.create(model="agent-harness", input="where now?", tools=[LOCATION], stream=True)
    )
    assert events[-1].type == "response.completed", events[-1]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].name == "get_location", events
    [call] = [o for o in events[-1].response.output if o.type == "function_call"]
    rest = typed_events(
        client.responses.create(
            model="agent-harness",
            previous_response_id=events[-1].response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Paris"}],
            stream=True,
        )
    )
    assert rest[-1].type == "response.completed", rest[-1]
    assert "Paris" in text_of(rest), text_of(rest)
    return 2


def approval_checks(client: OpenAI) -> int:
    """A write that waits for a person (the service's approval policy):
    the response ends at an `mcp_approval_request` item; the next request
    answers it with an `mcp_approval_response`, and the same turn goes on
    with the write."""
    asked = client.responses.create(model="agent-harness", input="write a note about Lyon")
    assert asked.status == "completed", asked
    [request] = [o for o in asked.output if o.type == "mcp_approval_request"]
    assert request.name == "write_note" and request.server_label == "agent-harness", request
    answered = client.responses.create(
        model="agent-harness",
        previous_response_id=asked.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}],
    )
    assert answered.status == "completed", answered
    [call] = [o for o in answered.output if o.type == "mcp_call"]
    assert call.name == "write_note" and call.error is None, call
    assert answered.output_text.startswith("The note tool said"), answered.output_text

    # Streamed, and denied: the call fails with the reason, the turn ends.
    events = typed_events(client.responses.create(model="agent-harness", input="write a note about Nice", stream=True))
    assert events[-1].type == "response.completed", events[-1]
    [request] = [o for o in events[-1].response.output if o.type == "mcp_approval_request"]
    rest = typed_events(
        client.responses.create(
            model="agent-harness",
            previous_response_id=events[-1].response.id,
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request.id,
                    "approve": False,
                    "reason": "not this one",
                }
            ],
            stream=True,
        )
    )
    assert rest[-1].type == "response.completed", rest[-1]
    failed = [e for e in rest if e.type == "response.mcp_call.failed"]
    assert failed, [e.type for e in rest]
    [call] = [o for o in rest[-1].response.output if o.type == "mcp_call"]
    assert "not this one" in str(call.error), call
    return 2


def files_checks(client: OpenAI) -> int:
    """`client.files`: an upload, read back whole, listed, deleted; a ZIP
    that says it is a PNG refused."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 1200
    made = client.files.create(file=("shot.png", png, "image/png"), purpose="user_data")
    assert made.id.startswith("file-") and made.bytes == len(png), made
    assert made.filename == "shot.png" and made.purpose == "user_data", made
    assert client.files.retrieve(made.id).bytes == len(png)
    assert client.files.content(made.id).read() == png
    assert made.id in [f.id for f in client.files.list()]
    # The image and a PDF by file id in a response, an image as a data URL
    # in a completion: the model is shown them (the demo says what it got).
    pdf = client.files.create(file=("a.pdf", b"%PDF-1.7\n% tiny\n", "application/pdf"),
                              purpose="user_data")
    response = client.responses.create(
        model="agent-harness",
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What are these?"},
            {"type": "input_image", "file_id": made.id, "detail": "low"},
            {"type": "input_file", "file_id": pdf.id},
        ]}],
    )
    said = response.output_text
    assert f"[attached image/png, {len(png)} bytes]" in said, said
    assert "[attached application/pdf, 16 bytes]" in said, said
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    answer = client.chat.completions.create(
        model="agent-harness",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "And this?"},
            {"type": "image_url", "image_url": {"url": data_url}},
        ]}],
    )
    said = answer.choices[0].message.content
    assert f"[attached image/png, {len(png)} bytes]" in said, said
    deleted = client.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id, deleted
    try:
        client.files.retrieve(made.id)
        raise AssertionError("a deleted file was found")
    except openai.NotFoundError as e:
        assert e.body["code"] == "file_not_found", e.body
    try:
        client.files.create(file=("cat.png", b"PK\x03\x04" + b"zip" * 10, "image/png"),
                            purpose="user_data")
        raise AssertionError("a ZIP was stored as a PNG")
    except openai.APIStatusError as e:
        assert e.status_code == 415 and e.body["code"] == "unsupported_media_type", e.body
    return 5


class City(BaseModel):
    city: str
    population: int


def reasoning_checks(client: OpenAI) -> int:
    """A model's reasoning: a Responses stream's `reasoning` item and its
    `response.reasoning_text.*` events (each validated by the SDK's
    union), and a completion stream's `reasoning_content` deltas."""
    events = typed_events(client.responses.create(model="agent-harness", input="think first, then hello",
                                                  stream=True))
    reasoned = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoned.startswith("The user wants me to think first."), [e.type for e in events]
    final = events[-1].response
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == reasoned, final
    assert text_of(events).startswith("Echo: think first"), text_of(events)
    deltas = []
    for chunk in client.chat.completions.create(
        model="agent-harness", messages=[{"role": "user", "content": "think first"}], stream=True
    ):
        if chunk.choices:
            deltas.append(chunk.choices[0].delta.model_dump().get("reasoning_content") or "")
    assert "".join(deltas) == reasoned, deltas
    return 2


def output_checks(client: OpenAI) -> int:
    """`responses.parse(text_format=…)` and `chat.completions.parse(
    response_format=…)` get objects of the model, also when the first
    answer is broken JSON (the service repairs it); an answer that never
    fits is an `incomplete` response (`output_invalid`)."""
    parsed = client.responses.parse(
        model="agent-harness", input="broken json first: where is the Louvre?", text_format=City
    )
    assert isinstance(parsed.output_parsed, City), parsed
    completion = client.chat.completions.parse(
        model="agent-harness",
        messages=[{"role": "user", "content": "broken json first: where?"}],
        response_format=City,
    )
    assert isinstance(completion.choices[0].message.parsed, City), completion
    schema = City.model_json_schema() | {"additionalProperties": False}
    never = client.responses.create(
        model="agent-harness",
        input="never json, please",
        text={"format": {"type": "json_schema", "name": "City", "schema": schema, "strict": True}},
    )
    assert never.status == "incomplete", never
    assert never.incomplete_details.reason == "output_invalid", never
    return 3


def main(binary: str) -> None:
    # Keep-alive comments every second: the slow answer below waits 2.5 s
    # for its first word, so the SDK reads some.
    with service.running(binary, HARNESS_SSE_KEEPALIVE_S="1") as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
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
        passed = 3 + responses_checks(client) + files_checks(client) + output_checks(client)
        passed += reasoning_checks(client)
    # The same service, whose writes wait for a person.
    with service.running(binary, HARNESS_APPROVAL_REQUIRED="LOCAL_WRITE") as base:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        passed += approval_checks(client)
    print(f"openai-sdk: {passed} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
