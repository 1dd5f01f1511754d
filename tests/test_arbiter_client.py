"""The arbiter's client (`oddl wait`, `oddl run` on an arbiter's testbed): its polls keep
their connection. Reproducer: each call made a new HTTP client, which loads the CA store
(60 ms of CPU), and `oddl wait` polling every 0.2 s spent a third of a core on it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from oddl.app.cli.queue import _call
from oddl.app.experiments.remote import ArbiterClient


class _Arbiter(BaseHTTPRequestHandler):
    """Answers every request with a job, and counts the connections it was asked on."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the arbiter's server
    connections: ClassVar[list[int]] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        body = json.dumps({"job": "j1", "state": "running"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def arbiter(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    _Arbiter.connections = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Arbiter)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", token
    finally:
        srv.shutdown()
        srv.server_close()


def test_reads_keep_their_connection_and_a_change_takes_its_own(
        arbiter: tuple[str, Path]) -> None:
    url, token = arbiter
    client = ArbiterClient(url, token)
    for _ in range(5):  # a wait's polls
        assert client.call("GET", "/jobs/j1")["state"] == "running"
    assert len(_Arbiter.connections) == 1
    client.call("POST", "/jobs", {"experiment": ""})  # never on a kept connection
    assert len(_Arbiter.connections) == 2


def test_a_commands_calls_share_one_client(arbiter: tuple[str, Path]) -> None:
    url, token = arbiter
    for _ in range(3):
        assert _call(url, token, "GET", "/jobs/j1")["job"] == "j1"
    assert len(_Arbiter.connections) == 1


@pytest.mark.parametrize("limit", ["nan", "inf", "-1", "0", "x"])
def test_a_time_limit_that_is_no_time_is_refused_by_the_client(root: Path, limit: str
                                                               ) -> None:
    """Reproducer (issue 64): `--time-limit nan` passed the client (click's FloatRange lets
    nan through) and failed as a traceback-looking JSON error."""
    from click.testing import CliRunner
    from oddl.app.cli import main

    r = CliRunner().invoke(main, ["submit", str(root / "experiments" / "job-resnet50-16.toml"),
                                  "--time-limit", limit, "--arbiter", "http://127.0.0.1:9",
                                  "--token-file", "/dev/null"])
    assert r.exit_code == 2 and "Invalid value for '--time-limit'" in r.output, r.output
