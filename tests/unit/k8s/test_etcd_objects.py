"""The EKS cluster's etcd: the rendered objects (valid against the kubernetes client's models, shaped for a majority
that survives any one node) and the administration script the cluster runs (against a real etcd here)."""

from __future__ import annotations

import re

import pytest

from cluster_assets.k8s import etcd, etcd_admin_job, schema
from cluster_assets.k8s.runtime import build_cluster_training_runtime, replicated_job
from cluster_facts import versions

SYSTEM = {"t5-failover/pool": "system"}


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    groups = etcd.cluster_objects(admin_image="reg/t5:1", training_namespace="training", node_selector=SYSTEM)
    return {
        f"{o['kind']}/{o['metadata'].get('namespace', '-')}/{o['metadata']['name']}": o
        for group in groups.values()
        for o in group
    }


def only(objects: dict[str, dict], kind: str) -> dict:
    (obj,) = [o for k, o in objects.items() if k.startswith(kind + "/")]
    return obj


def test_every_object_round_trips_through_the_kubernetes_models(objects):
    for obj in [*objects.values(), etcd.add_job_job("t5-x", admin_image="reg/t5:1", training_namespace="training")]:
        schema.roundtrip_core(obj)
    bad = etcd.statefulset(image="reg/t5:1")
    bad["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(schema.SchemaError, match=r"containers\[0\].imagePulPolicy: unknown field"):
        schema.roundtrip_core(bad)


def test_three_members_one_per_system_node_on_their_own_volumes(objects):
    sts = only(objects, "StatefulSet")
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel" and spec["serviceName"] == "etcd"
    labels = spec["template"]["metadata"]["labels"]
    (anti,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        anti["topologyKey"] == "kubernetes.io/hostname"
        and anti["labelSelector"]["matchLabels"].items() <= labels.items()
    )
    assert pod["nodeSelector"] == SYSTEM
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == only(objects, "StorageClass")["metadata"]["name"]
    assert only(objects, "StorageClass")["parameters"] == {"type": "gp3", "encrypted": "true"}
    (c,) = pod["containers"]
    assert {"name": "data", "mountPath": "/var/lib/etcd"} in c["volumeMounts"]
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = only(objects, "Service")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]


def test_members_run_the_pinned_current_etcd_with_tls_and_auth(objects):
    (c,) = only(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    # the administration image, which carries etcd's binary from the pinned image (test_etcd_member_start.py)
    assert c["image"] == "reg/t5:1" and re.fullmatch(
        r"[^@]+:3\.(\d+)\.(\d+)-0@sha256:[0-9a-f]{64}", versions.ETCD_IMAGE
    )
    minor, patch = map(int, re.search(r":3\.(\d+)\.(\d+)", versions.ETCD_IMAGE).groups())
    assert (minor, patch) >= (5, 3), "etcd 3.5.0-3.5.2 is not recommended for production"
    args = c["args"]
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        assert flag in args
    assert any(a.startswith("--auth-token=jwt,") for a in args)
    assert all(a.startswith("https://") for a in re.findall(r"https?://[^,]+", " ".join(args)) if ":2381" not in a)
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    # the peers are the members the agents are given, on the peer port
    assert cluster.split("=", 1)[1] == ",".join(
        f"etcd-{i}={e.rsplit(':', 1)[0]}:{etcd.PEER_PORT}" for i, e in enumerate(etcd.endpoints())
    )


def test_network_policy_admits_training_pods_admin_pods_and_members_only(objects):
    policy = only(objects, "NetworkPolicy")
    members = only(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= members.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sources = [
        (peer, [p["port"] for p in rule["ports"]]) for rule in policy["spec"]["ingress"] for peer in rule["from"]
    ]
    rt = build_cluster_training_runtime(
        name="rt", pvc_name="fsx", image="i:1", max_restarts=1, gpus_per_node=0, efa_per_node=0
    )
    training = replicated_job(rt, "node")["template"]["spec"]["template"]["metadata"]["labels"]
    admin = etcd.add_job_job("x", admin_image="i:1", training_namespace="training")["spec"]["template"]["metadata"][
        "labels"
    ]
    allowed = {}
    for peer, ports in sources:
        ns = (peer.get("namespaceSelector") or {}).get("matchLabels", {}).get("kubernetes.io/metadata.name", "t5-etcd")
        allowed[(ns, tuple(sorted(peer["podSelector"]["matchLabels"].items())))] = ports
    assert allowed == {
        ("t5-etcd", tuple(sorted({"t5-failover/component": "etcd"}.items()))): [2379, 2380],
        ("training", tuple(sorted({"t5-failover/component": "training"}.items()))): [2379],
        ("t5-etcd", tuple(sorted({"t5-failover/component": "etcd-admin"}.items()))): [2379],
    }
    assert training["t5-failover/component"] == "training" and admin["t5-failover/component"] == "etcd-admin"


def test_admin_pods_run_the_script_the_configmap_carries(objects):
    cm = only(objects, "ConfigMap")
    job = next(o for k, o in objects.items() if k.startswith("Job/"))
    assert re.fullmatch(r"etcd-bootstrap-[0-9a-f]{8}", job["metadata"]["name"])
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", f"{etcd.ADMIN_SCRIPT_DIR}/etcd_admin_job.py", "bootstrap"]
    assert cm["data"]["etcd_admin_job.py"] == etcd.ADMIN_SCRIPT.read_text()
    assert pod["serviceAccountName"] == etcd.BOOTSTRAP_SERVICE_ACCOUNT and pod["nodeSelector"] == SYSTEM
    # the script's names are the rendered objects' names
    assert (
        etcd_admin_job.CA_SECRET,
        etcd_admin_job.MEMBER_SECRET,
        etcd_admin_job.ADMIN_SECRET,
        etcd_admin_job.CLIENT_SECRET,
    ) == (etcd.CA_SECRET, etcd.MEMBER_SECRET, etcd.ADMIN_SECRET, etcd.CLIENT_SECRET)
    assert (etcd_admin_job.CA_CERT, etcd_admin_job.CLIENT_CERT, etcd_admin_job.CLIENT_KEY, etcd_admin_job.PASSWORD) == (
        etcd.CA_CERT,
        etcd.CLIENT_CERT,
        etcd.CLIENT_KEY,
        etcd.PASSWORD,
    )
    assert etcd_admin_job.job_secret_name("j") == etcd.job_secret_name("j")
    # what each service account may do: tests/integration/k8s/test_etcd_admin_rbac.py


def test_submit_prints_the_etcd_objects_the_stack_installs():
    import yaml
    from tests.support.k8s import submit_cli

    from tools.k8s.submit import PRINTED_ADMIN_IMAGE

    r = submit_cli("--dry-run", "--print-etcd", "--image", "reg/t5:1", "--name", "t5-a", "--nodes", "2")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    want = etcd.cluster_objects(admin_image=PRINTED_ADMIN_IMAGE, training_namespace="training", node_selector=SYSTEM)
    assert docs[:-1] == [o for group in want.values() for o in group] and docs[-1]["kind"] == "TrainJob"
