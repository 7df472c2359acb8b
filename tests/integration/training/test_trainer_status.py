"""The TrainJob status report (training.job.trainer_status) against a real HTTPS endpoint on loopback (TLS from a
CA of our own, a bearer token checked, as the Trainer's status server does): what rank 0's metrics logger posts,
at most once per interval, with the rotating token read again, and a refused report that never stops training.
Not verified here: the Trainer controller itself (no cluster on this machine)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training.config import MetricsConfig
from training.job.metrics import MetricsLogger
from training.job.tensorboard import NullLog
from training.launch.rendezvous.certs import CertificateAuthority


class StatusServer:
    """An HTTPS endpoint that keeps every POST whose bearer token is the one in ``token_file`` (else 401)."""

    def __init__(self, tmp_path):
        ca = CertificateAuthority.create(str(tmp_path / "tls"))
        server = ca.issue("status-server", str(tmp_path / "tls"), hosts=["127.0.0.1"])
        self.ca_file, self.token_file = ca.paths.cert, tmp_path / "token"
        self.token_file.write_text("token-1\n")
        self.posts: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                ok = auth == f"Bearer {outer.token_file.read_text().strip()}" and self.path == "/status/t5-x"
                if ok:
                    outer.posts.append((auth, body))
                self.send_response(200 if ok else 401)
                self.end_headers()
                self.wfile.write(b"{}" if ok else b"token refused")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(server.cert, server.key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/status/t5-x"

    def env(self, monkeypatch) -> None:
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", self.url)
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", self.ca_file)
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(self.token_file))


@pytest.fixture
def server(tmp_path):
    s = StatusServer(tmp_path)
    yield s
    s.httpd.shutdown()


def step(n: int, loss: float) -> dict:
    return dict(
        step=n,
        loss=loss,
        lr=1e-3,
        grad_norm=1.0,
        tokens_per_s=1000.0 + n,
        step_time_s=0.01,
        ckpt_block_s=0.0,
        world_size=2,
        restart_count=1,
        data_offset=4 * (n - 1),
        tokens=10,
    )


def metrics(body: dict) -> dict:
    return {m["name"]: m["value"] for m in body["trainerStatus"]["metrics"]}


def test_rank_0_reports_progress_at_most_once_per_interval_with_the_token_read_again(tmp_path, server, monkeypatch):
    server.env(monkeypatch)
    path = tmp_path / "metrics.jsonl"
    # an earlier attempt, killed after step 3: the report's failure count and goodput come from the whole run
    t0 = time.time() - 60
    earlier = [
        {"event": "start", "time": t0, "world_size": 2, "restart_count": 0, "resumed_from": None},
        *[{"event": "step", "time": t0 + n, **step(n, 5.0)} for n in (1, 2, 3)],
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in earlier))
    cfg = MetricsConfig(path=str(path), tensorboard=False)
    assert isinstance(MetricsLogger(cfg, rank=1, total_steps=100).trainer_status, NullLog)  # rank 0 only
    m = MetricsLogger(cfg, rank=0, total_steps=100)
    m.event("start", world_size=2, restart_count=1, resumed_from=2)
    t = time.perf_counter()
    for n in range(3, 51):  # much faster than the 5 s interval: one report now, the rest held back
        m.step(**step(n, 4.0 - n / 100))
    assert time.perf_counter() - t < 1.0  # records never wait on the network
    deadline = time.monotonic() + 10
    while not server.posts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.posts) == 1
    server.token_file.write_text("token-2\n")  # the projected token rotated
    m.end("finished", 50)
    m.close()  # the final report
    assert [auth for auth, _ in server.posts] == ["Bearer token-1", "Bearer token-2"]
    final = server.posts[-1][1]["trainerStatus"]
    assert final["progressPercentage"] == 50 and final["lastUpdatedTime"].endswith("Z")
    got = metrics(server.posts[-1][1])
    assert got["step"] == "50" and float(got["loss"]) == pytest.approx(4.0 - 50 / 100)
    assert got["world_size"] == "2" and got["failures"] == "1" and got["last_failure_step"] == "3"
    assert 0 < float(got["goodput"]) < 1
    assert final["estimatedRemainingSeconds"] >= 0


def test_a_refused_report_warns_once_and_training_goes_on(tmp_path, server, monkeypatch, capfd):
    server.env(monkeypatch)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(tmp_path / "stale-token"))
    (tmp_path / "stale-token").write_text("not-the-token")
    m = MetricsLogger(MetricsConfig(path=str(tmp_path / "metrics.jsonl"), tensorboard=False), rank=0, total_steps=3)
    m.event("start", world_size=2, restart_count=0, resumed_from=None)
    for n in (1, 2, 3):
        m.step(**step(n, 4.0))
    m.end("finished", 3)
    m.close()
    err = capfd.readouterr().err
    assert server.posts == [] and err.count("TrainJob status report to") == 1 and "401 token refused" in err
    assert (tmp_path / "metrics.jsonl").read_text().count('"event": "step"') == 3


def test_no_endpoint_no_reporter(tmp_path, monkeypatch):
    for v in ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_STATUS_URL"):
        monkeypatch.delenv(v, raising=False)
    m = MetricsLogger(MetricsConfig(path=str(tmp_path / "metrics.jsonl"), tensorboard=False), rank=0, total_steps=3)
    assert isinstance(m.trainer_status, NullLog)
    m.close()
