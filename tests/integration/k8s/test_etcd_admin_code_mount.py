"""The administration pods' code, as the ConfigMap mounts it, runs alone: without the rest of the repository and
without torch (the administration image has Python, requests and cryptography only; issue #53 item 1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cluster_assets.k8s import etcd

# Runs in a fresh interpreter in isolated mode (-I: no PYTHONPATH, no current directory on sys.path) from the
# mounted tree, as `python /opt/t5-etcd-admin/etcd_admin_job.py` puts its own directory first.
PROBE = r"""
import sys, tempfile
sys.path.insert(0, sys.argv[1])
import etcd_admin_job
from training.launch.rendezvous import admin, certs, client
for m in (etcd_admin_job, admin, certs, client):
    assert m.__file__.startswith(sys.argv[1]), m.__file__
with tempfile.TemporaryDirectory() as work:
    ca = certs.CertificateAuthority.create(work)
    ca.issue("etcd-member", work, hosts=["etcd-0.etcd.t5-etcd.svc"])
    certs.jwt_key_pair(work)
assert "torch" not in sys.modules
print("ok", sorted(m for m in sys.modules if m.startswith("training")))
"""


def test_the_mounted_code_imports_and_makes_certificates_without_the_repository_or_torch(tmp_path: Path):
    cm = etcd.admin_script_configmap()
    (volume,) = etcd.bootstrap_job(admin_image="i:1", training_namespace="training")["spec"]["template"]["spec"][
        "volumes"
    ]
    for item in volume["configMap"]["items"]:  # what the kubelet writes into ADMIN_SCRIPT_DIR
        path = tmp_path / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]])
    r = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok ['training', 'training.launch', 'training.launch.rendezvous',")
