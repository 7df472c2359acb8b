"""The EKS member's rendered command runs from the mounted code alone: the ConfigMap's tree on PYTHONPATH, the
repair decides, then the process becomes the command after ``--`` with the decided flags (issue #53 item 3).

etcd itself is stood in for by ``echo`` (it prints the argv etcd would get): the rendered flags make a member
listen on every address at ports 2379/2380, which a test cannot take. The repair against real members:
tests/integration/failover/test_member_repair.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_assets.k8s import etcd
from training.launch.rendezvous.certs import CertificateAuthority
from training.launch.rendezvous.members import MEMBER_PORTS


@pytest.fixture
def member(tmp_path: Path):
    """The member container's command and args as the kubelet runs them, with its mounts under ``tmp_path``."""
    cm = next(
        o
        for o in etcd.cluster_objects(admin_image="i:1", training_namespace="t")["members"]
        if o["kind"] == "ConfigMap"
    )
    (sts,) = [
        o
        for o in etcd.cluster_objects(admin_image="i:1", training_namespace="t")["members"]
        if o["kind"] == "StatefulSet"
    ]
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    (script,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "script"]
    tree = tmp_path / "code"
    for item in script["configMap"]["items"]:  # what the kubelet writes into the mount
        (tree / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tree / item["path"]).write_text(cm["data"][item["key"]])
    admin, made = tmp_path / "admin", tmp_path / "made"  # root's Secret's keys as the kubelet mounts them
    ca = CertificateAuthority.create(str(made))
    issued = ca.issue("t5-admin", str(made))
    admin.mkdir()
    for source, key in ((issued.cert, etcd.CLIENT_CERT), (issued.key, etcd.CLIENT_KEY), (ca.paths.cert, etcd.CA_CERT)):
        shutil.copy(source, admin / key)
    closed = f"https://127.0.0.1:{MEMBER_PORTS.start - 1}"  # the other members: nothing listens (not resolvable here)
    places = {
        "$(POD_NAME)": "etcd-0",
        etcd.ADMIN_CREDENTIALS_DIR: str(admin),
        etcd.DATA_DIR: str(tmp_path / "data"),
        f"--endpoints={','.join(etcd.endpoints())}": f"--endpoints={closed}",
        etcd.ETCD_BIN: shutil.which("echo"),
    }

    def here(args: list[str]) -> list[str]:
        out = []
        for arg in args:
            for rendered, local in places.items():
                arg = arg.replace(rendered, local)
            out.append(arg)
        return out

    def run() -> subprocess.CompletedProcess:
        argv = here(c["command"] + c["args"])
        assert argv[0] == "python"
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tree)}  # the container's: the mounted tree only
        return subprocess.run(
            [sys.executable, *argv[1:]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    return run, tmp_path / "data", here(c["args"]), admin


def test_a_member_with_its_data_becomes_etcd_with_its_flags_as_rendered(member):
    run, data, args, _ = member
    (data / "member" / "wal").mkdir(parents=True)
    r = run()
    assert r.returncode == 0, r.stderr[-2000:]
    said, etcd_argv = r.stdout.splitlines()
    assert said.startswith("[etcd member etcd-0] data in ") and "starts as itself" in said
    assert etcd_argv.split() == args


def test_the_first_start_of_a_member_whose_peers_do_not_answer_is_new(member):
    run, data, _, _ = member
    r = run()
    assert r.returncode == 0, r.stderr[-2000:]
    said, etcd_argv = r.stdout.splitlines()
    assert "first start of the cluster, as new" in said
    assert "--initial-cluster-state=new" in etcd_argv.split()


def test_the_first_start_before_the_bootstrap_made_roots_secret_is_as_rendered(member):
    """The optional Secret is not there yet (the bootstrap makes it once the members run): start as given."""
    run, data, args, admin = member
    shutil.rmtree(admin)
    r = run()
    assert r.returncode == 0, r.stderr[-2000:]
    said, etcd_argv = r.stdout.splitlines()
    assert "no administrative credentials yet" in said and etcd_argv.split() == args
