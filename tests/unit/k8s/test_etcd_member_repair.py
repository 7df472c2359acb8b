"""The EKS members run the start-time repair (training/launch/rendezvous/member_repair.py) before etcd: a member
whose volume is lost rejoins by itself (issue #53 item 3). The repair itself: tests/integration/failover/
test_member_repair.py; the rendered command run from the mounted code: tests/integration/k8s/
test_etcd_member_start.py."""

from __future__ import annotations

import re

from cluster_assets.k8s import etcd
from cluster_facts import versions

ADMIN = "registry.example/t5-etcd-admin:abc"


def _member_pod() -> dict:
    (sts,) = [
        o
        for o in etcd.cluster_objects(admin_image=ADMIN, training_namespace="training")["members"]
        if o["kind"] == "StatefulSet"
    ]
    return sts["spec"]["template"]["spec"]


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_the_member_container_repairs_before_it_becomes_etcd_with_etcds_own_identity():
    pod = _member_pod()
    (c,) = pod["containers"]
    command = c["command"]
    assert command[:3] == ["python", "-m", "training.launch.rendezvous.member_repair"]
    assert command[-2:] == ["--", etcd.ETCD_BIN]  # then etcd, with the member's flags (args)
    repair, member = _flags(command[3:-2]), _flags(c["args"])
    # the repair speaks for the member etcd will be: the same name, peer URL and data directory
    assert repair["name"] == member["name"] == "$(POD_NAME)"
    assert repair["peer-url"] == member["initial-advertise-peer-urls"]
    assert repair["data-dir"] == member["data-dir"]
    assert repair["endpoints"] == ",".join(etcd.endpoints())
    # the decided flags are the ones etcd is given (the repair replaces them)
    assert {"initial-cluster", "initial-cluster-state"} <= member.keys()
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def volume_of(path: str) -> dict:
        (where,) = [m for m in mounts if path.startswith(m + "/")]
        return volumes[mounts[where]]

    # root's client certificate and password, for the membership changes (the member's own certificate has a
    # common name, which etcd refuses on the JSON gateway); optional: the bootstrap makes them after the members
    for key in ("ca", "cert", "key", "password-file"):
        secret = volume_of(repair[key])["secret"]
        assert secret["secretName"] == etcd.ADMIN_SECRET and secret["optional"] is True, key
    # the repair's code: the ConfigMap's tree on PYTHONPATH
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert volumes[mounts[env["PYTHONPATH"]]]["configMap"]["name"] == etcd.ADMIN_SCRIPT_CONFIGMAP
    assert "training/launch/rendezvous/member_repair.py" in {
        i["path"] for i in volumes[mounts[env["PYTHONPATH"]]]["configMap"]["items"]
    }
    # the retries end before the liveness probe gives up on a container that never opened its port
    probe = c["livenessProbe"]
    assert float(repair["wait-s"]) < probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]


def test_the_member_image_is_the_admin_image_with_etcds_binary_from_the_pinned_image():
    (c,) = _member_pod()["containers"]
    assert c["image"] == ADMIN
    dockerfile = (etcd.ADMIN_IMAGE_DIR / "Dockerfile").read_text()
    assert re.search(rf"^ARG ETCD_IMAGE={re.escape(versions.ETCD_IMAGE)}$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{ETCD_IMAGE\} AS etcd$", dockerfile, re.M)
    assert re.search(rf"^COPY --from=etcd {etcd.ETCD_BIN} {etcd.ETCD_BIN}$", dockerfile, re.M)
