"""AWS access is asked first, in one line: preflight, deploy and destroy name what is missing (credentials, a region,
the network, accepted credentials) before npm, a synth or CDK's "Unable to resolve AWS account".

STS is a real HTTP server on loopback answering as STS answers (the query protocol's XML), or a bound port that
refuses connections: AWS unreachable, as on a machine without a network path to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.infra import ROOT

IDENTITY = (
    '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult>'
    "<Arn>arn:aws:iam::123456789012:user/ops</Arn><UserId>AIDAEXAMPLE</UserId><Account>123456789012</Account>"
    "</GetCallerIdentityResult><ResponseMetadata><RequestId>r1</RequestId></ResponseMetadata>"
    "</GetCallerIdentityResponse>"
)
REFUSED = (
    '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
    "<Code>InvalidClientTokenId</Code><Message>The security token included in the request is invalid."
    "</Message></Error><RequestId>r2</RequestId></ErrorResponse>"
)


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections (bound, never listening), held for the test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def sts_server(status: int, body: str) -> tuple[ThreadingHTTPServer, str]:
    """A loopback HTTP server answering every POST with ``status`` and ``body``; (server, its URL)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def aws_env(tmp_path: Path, *, credentials: bool = True, **extra: str) -> dict[str, str]:
    """The environment without the machine's AWS settings (no profile, no instance metadata), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    if credentials:
        env.update(AWS_ACCESS_KEY_ID="AKIAEXAMPLEEXAMPLE00", AWS_SECRET_ACCESS_KEY="example/secret")
    return {**env, **extra}


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_preflight_takes_the_region_from_aws_region_and_says_when_aws_is_unreachable(
    tmp_path: Path, refusing_port: int
) -> None:
    # boto3 reads AWS_DEFAULT_REGION only; preflight said "no AWS region" while AWS_REGION (which the CDK CLI reads)
    # was set. Here the region is taken, and the closed STS port is named as the network, not the settings.
    env = aws_env(
        tmp_path, AWS_REGION="eu-west-1", AWS_ENDPOINT_URL_STS=f"http://127.0.0.1:{refusing_port}", PLATFORM="eks"
    )
    proc = run([sys.executable, "-m", "stacks.preflight"], env)
    assert proc.returncode == 1
    assert errors(proc) == [
        f"error: AWS is unreachable from this machine (http://127.0.0.1:{refusing_port}: could "
        "not connect): make preflight needs network access to AWS in eu-west-1; check the "
        "network, proxy (HTTPS_PROXY) or VPC endpoint, then rerun"
    ]


@pytest.mark.parametrize(
    "credentials, region, expected",
    [
        (
            False,
            "us-east-1",
            "error: no AWS credentials: configure them (aws configure, AWS_PROFILE, or "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), then rerun make deploy",
        ),
        (
            True,
            None,
            "error: no AWS region: set AWS_REGION, pass -c region=..., or configure a default region (aws "
            "configure), then rerun make deploy",
        ),
    ],
)
def test_missing_credentials_or_region_are_named_with_their_fix(
    tmp_path: Path, credentials: bool, region: str | None, expected: str
) -> None:
    env = aws_env(tmp_path, credentials=credentials, **({"AWS_REGION": region} if region else {}))
    proc = run([sys.executable, "-m", "stacks.aws_access", "make deploy"], env)
    assert proc.returncode == 1
    assert errors(proc) == [expected]


def test_refused_credentials_say_aws_s_reason_and_accepted_ones_say_who(tmp_path: Path) -> None:
    refusing, refusing_url = sts_server(403, REFUSED)
    accepting, accepting_url = sts_server(200, IDENTITY)
    try:
        proc = run(
            [sys.executable, "-m", "stacks.aws_access", "make destroy"],
            aws_env(tmp_path, AWS_REGION="us-east-1", AWS_ENDPOINT_URL_STS=refusing_url),
        )
        assert proc.returncode == 1
        assert errors(proc) == [
            "error: AWS refused the credentials (InvalidClientTokenId: The security token "
            "included in the request is invalid.): configure them (aws configure, AWS_PROFILE, "
            "or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), then rerun make destroy"
        ]
        # the region the deploy is bound to (-c region=...) wins over the environment's
        proc = run(
            [sys.executable, "-m", "stacks.aws_access", "make deploy", "-c", "region=ap-south-1"],
            aws_env(tmp_path, AWS_REGION="us-east-1", AWS_ENDPOINT_URL_STS=accepting_url),
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip() == "[aws] account 123456789012 in ap-south-1 (arn:aws:iam::123456789012:user/ops)"
    finally:
        refusing.shutdown()
        accepting.shutdown()


def checkout_copy(tmp_path: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) in a scratch directory with the project venv
    linked: a deploy there saves its settings there, never in the checkout the other tests read."""
    dst = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(
        ["tar", "-c", "--null", "-T", "-", "-f", "-"],
        cwd=ROOT,
        input=files,
        check=True,
        stdout=open(tmp_path / "tree.tar", "wb"),
    )
    dst.mkdir()
    subprocess.run(["tar", "-x", "-f", str(tmp_path / "tree.tar")], cwd=dst, check=True)
    (dst / ".venv").symlink_to(ROOT / ".venv")
    return dst


@pytest.mark.parametrize(
    "script, argv",
    [
        (
            "deploy.sh",
            [
                "-c",
                "adminRoleArn=arn:aws:iam::123456789012:role/Admin",
                "-c",
                "apiAllowedCidrs=203.0.113.7/32",
                "-c",
                "imageTag=src-0123456789ab",
            ],
        ),
        ("destroy.sh", ["--cluster-only"]),
    ],
)
def test_deploy_and_destroy_offline_stop_at_once_with_one_line_before_npm_or_cdk(
    tmp_path: Path, refusing_port: int, script: str, argv: list[str]
) -> None:
    # Before: npm ci (two minutes of registry retries offline), a synth, then CDK's "Unable to resolve AWS account".
    root = checkout_copy(tmp_path)
    env = aws_env(
        tmp_path, AWS_REGION="us-east-1", AWS_ENDPOINT_URL_STS=f"http://127.0.0.1:{refusing_port}", PLATFORM="eks"
    )
    proc = run([str(root / "scripts" / script), *argv], env, cwd=root)
    assert proc.returncode == 1
    verb = script.removesuffix(".sh")
    assert errors(proc) == [
        f"error: AWS is unreachable from this machine (http://127.0.0.1:{refusing_port}: could "
        f"not connect): make {verb} needs network access to AWS in us-east-1; check the "
        "network, proxy (HTTPS_PROXY) or VPC endpoint, then rerun"
    ]
    assert "[cdk]" not in proc.stderr and "Synthesis" not in proc.stdout + proc.stderr  # neither npm nor CDK ran
    assert not (root / "node_modules").exists() and not (root / "cdk.out").exists()
