"""The service as the SDK checks run it: the binary given, the `demo`
provider, a fresh SQLite file and vault, a free loopback port; stopped
(SIGTERM, then waited for) when the block ends."""

import contextlib
import os
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(binary: str, **settings: str):
    """Yields the base URL of the running service; `settings` are more
    `HARNESS_…` variables, in which `{port}` is the port taken."""
    port = free_port()
    settings = {name: value.replace("{port}", str(port)) for name, value in settings.items()}
    with tempfile.TemporaryDirectory() as folder:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HARNESS_PROVIDERS": "demo:echo",
            "HARNESS_LISTEN": f"127.0.0.1:{port}",
            "DATABASE_URL": f"sqlite://{folder}/h.db",
            "HARNESS_VAULT_DIR": f"{folder}/vault",
            "HARNESS_LOG_FORMAT": "json",
            **settings,
        }
        server = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            server.wait(timeout=30)
