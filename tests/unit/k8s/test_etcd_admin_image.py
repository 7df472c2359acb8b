"""The EKS etcd's administration pods run the stack's small image, never the training image (issue #53 item 1)."""

from __future__ import annotations

import re
from pathlib import Path

from cluster_assets.k8s import etcd
from cluster_facts.versions import ETCD_ADMIN_BASE_IMAGE

ROOT = Path(__file__).resolve().parents[3]
ADMIN = "registry.example/t5-etcd-admin:abc"
TRAINING = "registry.example/t5-train:src-1234"


def _pins(path: Path) -> dict[str, str]:
    lines = (ln.split("#")[0].strip() for ln in path.read_text().splitlines())
    return dict(ln.split("==", 1) for ln in lines if "==" in ln)


def _admin_pods() -> dict[str, dict]:
    objects = etcd.cluster_objects(admin_image=ADMIN, training_namespace="training")["admin"]
    pods = {o["kind"]: o for o in objects if o["kind"] in ("Job", "CronJob")}
    return {
        "bootstrap": pods["Job"]["spec"]["template"]["spec"],
        "renewal": pods["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        "add-job": etcd.add_job_job("t5-a", admin_image=ADMIN, training_namespace="training")["spec"]["template"][
            "spec"
        ],
    }


def test_every_administration_pod_runs_the_admin_image_with_the_code_from_its_configmap():
    members = etcd.cluster_objects(admin_image=ADMIN, training_namespace="t")["members"]
    cm = next(o for o in members if o["kind"] == "ConfigMap")
    for what, pod in _admin_pods().items():
        (c,) = pod["containers"]
        assert c["image"] == ADMIN, what
        assert c["securityContext"]["runAsNonRoot"] is True, what
        (volume,) = pod["volumes"]
        items = {i["key"]: i["path"] for i in volume["configMap"]["items"]}
        # the script at the top, the etcd modules under their package path (training and training.launch stay
        # namespace packages: their __init__ imports torch, which the image does not have)
        assert items == {
            "etcd_admin_job.py": "etcd_admin_job.py",
            "rendezvous.__init__.py": "training/launch/rendezvous/__init__.py",
            "rendezvous.admin.py": "training/launch/rendezvous/admin.py",
            "rendezvous.certs.py": "training/launch/rendezvous/certs.py",
            "rendezvous.client.py": "training/launch/rendezvous/client.py",
            "rendezvous.member_repair.py": "training/launch/rendezvous/member_repair.py",
        }, what
    for key, path in items.items():
        assert cm["data"][key] == (ROOT / ("cluster_assets/k8s/" if "/" not in path else "") / path).read_text()


def test_the_training_image_reaches_no_etcd_object():
    """cluster_objects has no training image to give (a missing or pruned training tag cannot stop the members
    from getting their Secrets, nor the monthly renewal)."""
    import inspect

    assert "image" not in inspect.signature(etcd.cluster_objects).parameters
    assert TRAINING not in repr(etcd.cluster_objects(admin_image=ADMIN, training_namespace="training"))


def test_a_code_change_makes_a_new_bootstrap_job(monkeypatch, tmp_path):
    """A Job's pod template cannot change: a change to any mounted module renames the bootstrap Job."""
    before = etcd.bootstrap_job(admin_image=ADMIN, training_namespace="training")["metadata"]["name"]
    changed = tmp_path / "certs.py"
    changed.write_text(etcd.ADMIN_CODE["rendezvous.certs.py"][1].read_text() + "\n# changed\n")
    monkeypatch.setitem(etcd.ADMIN_CODE, "rendezvous.certs.py", ("training/launch/rendezvous/certs.py", changed))
    assert etcd.bootstrap_job(admin_image=ADMIN, training_namespace="training")["metadata"]["name"] != before


def test_the_image_installs_the_projects_own_pins_on_the_pinned_base():
    image_pins = _pins(etcd.ADMIN_IMAGE_DIR / "requirements.txt")
    assert set(image_pins) == {"urllib3", "requests", "cryptography"}
    project = _pins(ROOT / "requirements.txt")
    assert {k: project[k] for k in image_pins} == image_pins
    dockerfile = (etcd.ADMIN_IMAGE_DIR / "Dockerfile").read_text()
    assert re.search(rf"^ARG BASE_IMAGE={re.escape(ETCD_ADMIN_BASE_IMAGE)}$", dockerfile, re.M)
    assert re.search(r"^USER 65532:65532$", dockerfile, re.M)
    # the build context is this directory alone: nothing from the repository is copied in
    assert sorted(p.name for p in etcd.ADMIN_IMAGE_DIR.iterdir()) == ["Dockerfile", "requirements.txt"]
