"""schemathesis (every check) against the running binary: openapi.yaml
must say what the server enforces. No 5xx, no response outside the
document, no request the document refuses that the server takes (ST201),
and none it allows that the server refuses (ST202), but the failures in
`openapi/schemathesis-baseline.json`, each of which
`openapi/schemathesis-baseline.md` explains.

Run by .ci/run after `cargo test`: the `demo` provider, a fresh SQLite
file, a free loopback port; a fixed seed and 30 examples an operation
(about 2,000 cases, under a minute), one worker.
"""

import os
import subprocess
import sys

from service import running

HERE = os.path.dirname(os.path.abspath(__file__))


def main(binary: str) -> int:
    document = os.path.join(HERE, "..", "openapi.yaml")
    baseline = os.path.join(HERE, "openapi", "schemathesis-baseline.json")
    # A JSON caller of a turn that waits for a client's tool waits until
    # the turn's deadline: 5 s here, well inside the request timeout.
    with running(binary, HARNESS_TURN_TIMEOUT_S="5", HARNESS_MEMORY_EXTRACTION="false") as url:
        run = subprocess.run(
            [
                "schemathesis", "run", document, "--url", url,
                "--checks", "all", "--max-examples", "30", "--seed", "1",
                "--workers", "1", "--request-timeout", "30",
                "--phases", "examples,coverage,fuzzing",
                "--baseline", baseline,
            ],
            cwd=os.environ.get("TMPDIR", "/tmp"),
            env={
                **os.environ,
                "SCHEMATHESIS_HOOKS": "hooks",
                "PYTHONPATH": os.path.join(HERE, "openapi"),
            },
            check=False,
        )
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
