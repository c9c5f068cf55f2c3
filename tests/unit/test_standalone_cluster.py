"""The test cluster's startup wait treats a master web UI that is not ready as not up yet."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, TimedOutError, _wait_for


class _Master:
    """Answers /json/ with an empty body ``empty`` times, then with one ALIVE worker."""

    def __init__(self, empty: int) -> None:
        self.empty = empty
        self.requests = 0
        master = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                master.requests += 1
                body = b"" if master.requests <= master.empty else json.dumps(
                    {"workers": [{"host": "127.0.0.2", "state": "ALIVE"},
                                 {"host": "127.0.0.3", "state": "DEAD"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@pytest.fixture
def master_after(request: pytest.FixtureRequest) -> Iterator[_Master]:
    m = _Master(empty=request.param)
    t = threading.Thread(target=m.server.serve_forever, daemon=True)
    t.start()
    yield m
    m.server.shutdown()
    m.server.server_close()


@pytest.mark.parametrize("master_after", [3], indirect=True)
def test_empty_answers_while_the_master_starts_are_waited_through(
        master_after: _Master, tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, master_webui_port=master_after.port)
    _wait_for(lambda: cluster.alive_workers() == ["127.0.0.2"], 30, "one ALIVE worker",
              poll_s=0.01)
    assert master_after.requests == 4


@pytest.mark.parametrize("master_after", [10**9], indirect=True)
def test_a_master_that_never_answers_json_times_out_naming_the_last_error(
        master_after: _Master, tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, master_webui_port=master_after.port)
    with pytest.raises(TimedOutError, match=r"registration.*last error: Expecting value"):
        _wait_for(lambda: bool(cluster.alive_workers()), 0.5, "registration", poll_s=0.01)
