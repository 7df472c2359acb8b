"""The Kubeflow Trainer's TrainJob status endpoint (feature gate ``TrainJobStatus``), as the contract emulator
serves it: HTTPS on loopback with a CA of its own, a bearer token in a file, the last ``trainerStatus`` kept.

    server = TrainerStatusServer(directory, namespace="default", name="t5-x")
    env = server.env()            # KUBEFLOW_TRAINER_SERVER_URL / _CA_CERT / _TOKEN, as the controller injects them
    ...
    server.last                   # the newest trainerStatus a pod posted (None: none yet)
    server.close()

A POST to another path, without the token or without a ``trainerStatus`` object is refused (404 / 401 / 400),
as the Trainer's status server refuses it; ``refused`` counts them.
"""

from __future__ import annotations

import json
import secrets
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from training.launch.rendezvous.certs import CertificateAuthority

PREFIX = "KUBEFLOW_TRAINER_SERVER_"


class TrainerStatusServer:
    """One TrainJob's status endpoint (see the module doc)."""

    def __init__(self, directory: Path, *, namespace: str, name: str):
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create(str(directory), name="trainer status server CA")
        cert = ca.issue("trainer-status", str(directory), hosts=["127.0.0.1"])
        self.ca_file, self.token_file = ca.paths.cert, directory / "token"
        self.token_file.write_text(secrets.token_hex(16))
        self.path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        self.last: dict[str, Any] | None = None
        self.updates = self.refused = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert.cert, cert.key)
        self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}{self.path}"

    def env(self) -> dict[str, str]:
        return {PREFIX + "URL": self.url, PREFIX + "CA_CERT": self.ca_file, PREFIX + "TOKEN": str(self.token_file)}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                code = server._take(self.path, self.headers.get("Authorization", ""), body)
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b"{}" if code == 200 else b'{"error": "refused"}')

        return Handler

    def _take(self, path: str, auth: str, body: bytes) -> int:
        if path != self.path:
            code = 404
        elif auth != f"Bearer {self.token_file.read_text().strip()}":
            code = 401
        else:
            try:
                status = json.loads(body)["trainerStatus"]
                code = 200 if isinstance(status, dict) else 400
            except (ValueError, KeyError, TypeError):
                code = 400
        if code == 200:
            self.last, self.updates = status, self.updates + 1
        else:
            self.refused += 1
        return code
