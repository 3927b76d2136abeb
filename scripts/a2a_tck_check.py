"""The A2A TCK (a2aproject/a2a-tck) against agent-harness.

    python3 scripts/a2a_tck_check.py BINARY TCK_DIR [--transports jsonrpc,rest]

TCK_DIR is a checkout of the TCK with its requirements installed (`pip
install -e TCK_DIR`). The TCK is published in no package registry, and
this project keeps no copy of it, so it is not part of `.ci/run`; see
docs/a2a.md ("The TCK").

Starts the binary given (the `demo` provider, answering every message
slowly enough that a task is seen working; a fresh SQLite file; keys on,
with one key made for the TCK), then runs the TCK's mandatory and
capabilities categories for each transport the card declares. A test the
TCK gets wrong is deselected by name below, each with why; every other
test must pass.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import service

# The TCK's categories run: mandatory, and the capabilities the card
# declares.
SUITES = ["tests/mandatory", "tests/optional/capabilities"]

# Tests that contradict the TCK's own pinned proto and specification.
WRONG = {
    # `SendMessage` waits for the task to end unless `returnImmediately`
    # (specification §3.2.2, "Wait for Completion" is the default). These
    # tests send without it and then expect the task to still be working,
    # or to be cancelable, or to take a second message.
    "tests/mandatory/protocol/test_tasks_list_method.py::create_test_task":
        "waits for WORKING after a blocking SendMessage (the task has ended)",
    "test_message_send_continue_task":
        "sends a message to a completed task; §3.1.1 says UnsupportedOperationError",
    "test_task_history_length":
        "sends a second message to a completed task (as above)",
    "test_tasks_cancel_valid":
        "cancels a task a blocking SendMessage saw complete; §3.1.5 says TaskNotCancelable",
    "test_core_method_mapping_compliance":
        "cancels a task a blocking SendMessage saw complete (as above)",
    "test_message_send_continue_with_contextid":
        "sends a message to a completed task (as above)",
    # Parts other than text, to an agent whose card takes text/plain only:
    # §3.3.2's ContentTypeNotSupportedError is the answer.
    "test_message_send_enhanced_parts_support":
        "expects file and data parts taken by a text/plain agent",
    "test_binary_data_handling":
        "expects file bytes taken by a text/plain agent (or -32601)",
    # Its webhook listens on one port for every test and waits for any
    # notification: the late updates of the task of the test before
    # count as this task's, and the check fails on them.
    "test_send_streaming_message_with_push_notification_config":
        "its webhook, shared with the test before, takes that task's late pushes as this one's",
    # The TCK calling its own helpers wrongly.
    "test_push_notification_not_supported_error_32003_enhanced":
        "calls transport_create_task_push_notification_config with 4 arguments; it takes 2-3",
    "test_tasks_list_with_existing_tasks":
        "passes a string to transport_send_message, which takes the params' dict",
}

# ... and with the HTTP+JSON transport only.
WRONG_OVER_REST = {
    # Its REST client reuses one async HTTP client across event loops.
    "test_tasks_subscribe":
        "its REST streaming fails with 'Event loop is closed' in the TCK's client",
    "test_sse_event_format_compliance":
        "as above: 'Event loop is closed' in the TCK's REST client",
    "test_push_notification_not_supported_error_32003":
        "sends raw JSON-RPC through its REST client, which has no send_raw_json_rpc",
}


def deselected(tck: str, wrong: dict[str, str]) -> list[str]:
    """`--deselect` arguments for the tests in `wrong`: a test by its exact
    name, or a helper's, which leaves out every test of its file that
    calls it."""
    nodes: list[str] = []
    for root in SUITES:
        for folder, _, files in os.walk(os.path.join(tck, root)):
            for name in sorted(files):
                if not (name.startswith("test_") and name.endswith(".py")):
                    continue
                path = os.path.relpath(os.path.join(folder, name), tck)
                with open(os.path.join(tck, path)) as source:
                    text = source.read()
                for test in tests_in(path, text):
                    if test.split("::")[-1] in wrong:
                        nodes.append(test)
                for helper in wrong:
                    if "::" in helper and helper.split("::")[0] == path:
                        nodes += tests_calling(path, text, helper.split("::")[1])
    arguments: list[str] = []
    for node in sorted(set(nodes)):
        arguments += ["--deselect", node]
    return arguments


def tests_in(path: str, text: str) -> list[str]:
    """Every test of a file, as node ids."""
    return tests_calling(path, text, None)


def tests_calling(path: str, text: str, helper: str | None) -> list[str]:
    """The tests of a file whose body calls `helper` (every test when
    `helper` is None), as node ids."""
    found, klass, test, calls = [], None, None, helper is None
    for line in text.splitlines() + ["def end():"]:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith(("def ", "async def ")) and indent <= 4:
            if test and calls:
                found.append(f"{path}::{klass}::{test}" if klass else f"{path}::{test}")
            name = stripped.split("def ", 1)[1].split("(", 1)[0]
            test, calls = (name if name.startswith("test_") else None), helper is None
            if indent == 0:
                klass = None
        elif stripped.startswith("class ") and indent == 0:
            if test and calls:
                found.append(f"{path}::{klass}::{test}" if klass else f"{path}::{test}")
            klass, test, calls = stripped[6:].split("(", 1)[0].split(":", 1)[0], None, helper is None
        elif test and helper and f"{helper}(" in line:
            calls = True
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("tck")
    parser.add_argument("--transports", default="jsonrpc,rest")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    with tempfile.TemporaryDirectory() as folder:
        database = f"sqlite://{folder}/h.db"
        made = subprocess.run(
            [binary, "keys", "create", "--tenant", "tck"],
            env={"PATH": os.environ.get("PATH", ""), "DATABASE_URL": database},
            capture_output=True, text=True, check=True,
        )
        key = made.stdout.strip().splitlines()[-1].split()[-1]
        settings = {
            "DATABASE_URL": database,
            "HARNESS_AUTH": "on",
            "HARNESS_PROVIDERS": "demo:slow",
            # The TCK's push tests post to a webhook of its own on loopback.
            "HARNESS_OUTBOUND_ALLOW_PRIVATE": "true",
            # The TCK flags an IP address in the card as "sensitive".
            "HARNESS_PUBLIC_URL": "http://localhost:{port}",
        }
        failed = False
        with service.running(binary, **settings) as base:
            base = base.replace("127.0.0.1", "localhost")
            env = {**os.environ, "A2A_AUTH_TYPE": "bearer", "A2A_AUTH_TOKEN": key}
            for transport in args.transports.split(","):
                command = [
                    sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    *SUITES,
                    "--sut-url", f"{base}/a2a", "--transports", transport, "--test-scope", "all",
                    "--transport-strategy", "all_supported",
                ]
                wrong = {**WRONG, **(WRONG_OVER_REST if transport == "rest" else {})}
                command += deselected(args.tck, wrong)
                print(f"== A2A TCK, {transport}", flush=True)
                run = subprocess.run(command, cwd=args.tck, env=env)
                failed |= run.returncode != 0
        for name, why in WRONG.items():
            print(f"deselected {name}: {why}")
        for name, why in WRONG_OVER_REST.items():
            print(f"deselected over HTTP+JSON {name}: {why}")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
