"""ParallelCluster: the stack's custom resource, and the config validated by the REAL aws-parallelcluster
3.16.1 schema in its own venv (.venv-pcluster); the etcd members' network, secrets and IAM, the nodes' security
groups, ECR pull policy and outputs; the node and member scripts (bash -n, shellcheck, run against scratch roots,
and the members' units run for real as a three-member etcd the head node's script turns authentication on in)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_assets.parallelcluster.node_setup import ETCD_CLIENT_SCRIPT
from tests.support.infra import ROOT
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.infra.test_infra_pcluster import CLIENT_SECRET, ROOT_SECRET

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.integration.infra.test_infra_pcluster import (
    MEMBERS_SECRET,
    MEMBER_SCRIPT,
    USER,
    _curl_serving,
    _etcd_tarball,
    _fake_aws,
    _member_args,
    _secret,
)


def _exec_start(unit_text: str, root: Path) -> list[str]:
    """The unit's ExecStart as argv, its absolute paths moved under the scratch root, python3 this interpreter
    (run with the repository on PYTHONPATH: :data:`UNIT_ENV`)."""
    joined = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit_text.replace("\\\n", " "), re.M | re.S).group(1)
    argv = shlex.split(joined)
    data = root / "var/lib/t5-etcd"
    out = []
    for a in argv:
        a = a.replace("/etc/t5-etcd", f"{root}/etc/t5-etcd").replace("/usr/local/bin", f"{root}/usr/local/bin")
        out.append(str(data) if a == "/var/lib/t5-etcd" else sys.executable if a == "/usr/bin/python3" else a)
    return out


#: The units' environment here: their PYTHONPATH names the member's ASSET_DIR, where boot.sh puts the repair's
#: modules under their package path; the repository has them at the same place.
UNIT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _free_port_on(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_member_units_form_a_cluster_the_head_node_secures_and_a_job_user_can_be_added(tmp_path: Path) -> None:
    """The three members' setup (member 0 makes the TLS material), their units run as written, the head node's
    script (credentials, authentication on, etcd.env), and the admin CLI the batch script runs, on that env."""
    ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    client_port, peer_port = _free_port_on("127.0.0.1"), _free_port_on("127.0.0.1")
    env = _fake_aws(tmp_path, {MEMBERS_SECRET: "{}", CLIENT_SECRET: "{}", ROOT_SECRET: "r00tPassw0rdFromCfn"})
    tarball, sha = _etcd_tarball(tmp_path, "3.6.14", "arm64")
    env["PATH"] = f"{_curl_serving(tmp_path, tarball)}:{env['PATH']}"
    members = []
    try:
        for i in (1, 0, 2):  # member 1 first: it waits for member 0's material
            root = tmp_path / f"m{i}"
            root.mkdir()
            member_env = {**env, "T5_SETUP_ROOT": str(root), "T5_TLS_POLL_S": "0.2", "T5_TLS_WAIT_S": "60"}
            proc = subprocess.Popen(
                [str(MEMBER_SCRIPT), *_member_args(i, ips, client_port, peer_port, sha)],
                env=member_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            members.append((i, root, proc))
        for i, root, proc in members:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, (i, out, err)
            assert f"[etcd member m{i}] t5-etcd.service: https://{ips[i]}:{client_port}" in out
            log = (root / "commands.log").read_text().splitlines()
            assert log[-3:] == [
                "systemctl daemon-reload",
                "systemctl enable t5-etcd.service",
                "systemctl restart --no-block t5-etcd.service",
            ]
            assert ("dnf install -y python3-cryptography" in log) is (i == 0)  # only member 0 makes material
            for name in ("member.key", "jwt.key"):
                assert oct((root / "etc/t5-etcd/tls" / name).stat().st_mode & 0o777) == "0o600"
        material = json.loads(_secret(env, MEMBERS_SECRET))
        assert sorted(material["members"]) == ["m0", "m1", "m2"]
        assert json.loads(_secret(env, CLIENT_SECRET))["ca_cert"] == material["ca_cert"]
        # The units, run as written.
        processes = []
        for _i, root, _ in members:
            unit = (root / "etc/systemd/system/t5-etcd.service").read_text()
            assert "User=etcd" in unit and "--client-cert-auth" in unit and "--peer-client-cert-auth" in unit
            assert "-m training.launch.rendezvous.member_repair" in unit  # etcd starts through the repair
            processes.append(
                subprocess.Popen(
                    _exec_start(unit, root),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    env=UNIT_ENV,
                )
            )
        try:
            head_root = tmp_path / "head"
            head_root.mkdir()
            endpoints = ",".join(f"https://{ip}:{client_port}" for ip in ips)
            head_env = {**env, "T5_SETUP_ROOT": str(head_root), "T5_SETUP_POLL_S": "0.2", "T5_SETUP_WAIT_S": "60"}
            head = [str(ETCD_CLIENT_SCRIPT), endpoints, CLIENT_SECRET, ROOT_SECRET, "us-east-1", USER]
            proc = subprocess.run(head, env=head_env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert "authentication turned on" in proc.stdout
            directory = f"{head_root}/home/{USER}/.t5-failover/etcd"
            shown = f"/home/{USER}/.t5-failover/etcd"
            env_file = (head_root / "etc/t5-failover/etcd.env").read_text().splitlines()
            settings = dict(line.split("=", 1) for line in env_file if line and not line.startswith("#"))
            helper = "/usr/local/sbin/t5-etcd-add-job"
            assert settings == {
                "T5_ETCD_ENDPOINTS": endpoints,
                "T5_ETCD_CA": f"{shown}/ca.crt",
                "T5_ETCD_CERT": f"{shown}/client.crt",
                "T5_ETCD_KEY": f"{shown}/client.key",
                "T5_ETCD_ADD_JOB": helper,  # no root password for the jobs' users: a helper run through sudo
            }
            # Root's password: on the head node's own disk, root's only; never on /home (every job user's, NFS).
            admin = head_root / "etc/t5-failover/admin"
            assert (admin / "root.password").read_text() == "r00tPassw0rdFromCfn"
            assert oct(admin.stat().st_mode & 0o777) == "0o700"
            assert oct((admin / "root.password").stat().st_mode & 0o777) == "0o600"
            assert "r00tPassw0rdFromCfn" not in "".join(
                f.read_text(errors="replace") for f in (head_root / "home").rglob("*") if f.is_file()
            )
            assert sorted(f.name for f in Path(directory).iterdir()) == ["ca.crt", "client.crt", "client.key"]
            for name in ("client.key",):
                assert oct(Path(directory, name).stat().st_mode & 0o777) == "0o600"
            assert not (admin / ".root-user.json").exists()
            sudoers = (head_root / "etc/sudoers.d/t5-etcd-add-job").read_text()
            assert f"ALL ALL=(root) NOPASSWD: {helper}\n" in sudoers  # that command only, with no argument fixed
            assert "/etc/t5-failover/etcd.env" in (head_root / "etc/profile.d/t5-failover-etcd.sh").read_text()
            # Again (an update, a rerun): authentication stays as it is.
            again = subprocess.run(head, env=head_env, capture_output=True, text=True, timeout=120)
            assert again.returncode == 0 and "already on: nothing changed" in again.stdout, again.stdout + again.stderr

            # What the submit runs (sudo -n t5-etcd-add-job JOB): the job's user, its credentials in the caller's
            # home, which the job's agents log in with; its role reaches the job's prefix only.
            def add_job(job: str) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [str(head_root) + helper, job], env=env, capture_output=True, text=True, timeout=120
                )

            made = add_job("run-1-0a1b2c3d")
            assert made.returncode == 0, made.stdout + made.stderr
            job_env = Path(made.stdout.splitlines()[-1])
            assert (
                job_env
                == head_root / f"home/{pwd.getpwuid(os.getuid()).pw_name}/.t5-failover/jobs/run-1-0a1b2c3d/job.env"
            )
            job_settings = dict(line.split("=", 1) for line in job_env.read_text().splitlines())
            assert job_settings["T5_ETCD_USER"] == "job-run-1-0a1b2c3d"
            assert job_settings["T5_ETCD_PREFIX"] == "/t5-failover/jobs/run-1-0a1b2c3d/"
            for f in job_env.parent.iterdir():
                assert oct(f.stat().st_mode & 0o777) == "0o600", f
            client = EtcdClient(ClientCredentials.from_env(job_settings))
            try:
                client.put("/t5-failover/jobs/run-1-0a1b2c3d/round", "1")
                assert client.get("/t5-failover/jobs/run-1-0a1b2c3d/round").value == "1"
                with pytest.raises(StoreRefused):
                    client.put("/t5-failover/jobs/another/round", "1")  # another job's prefix
            finally:
                client.close()
            again = add_job("run-1-0a1b2c3d")  # a job id that has a user: its agents' password is kept
            assert again.returncode == 2 and "has an etcd user already" in again.stderr, again.stderr
            bad = add_job("../etc")
            assert bad.returncode == 2 and "JOB '../etc' must be" in bad.stderr
            # ... and without root's password, etcd refuses (authentication is really on).
            (admin / "root.password").write_text("wrong")
            refused = add_job("run-2-0a1b2c3d")
            assert refused.returncode == 3 and "refused root's login" in refused.stderr, refused.stderr
        finally:
            for p in processes:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
    finally:
        for _, _, proc in members:
            if proc.poll() is None:
                proc.kill()
