"""The jobs' membership store on EKS: a 3-member etcd the stack installs, as plain Kubernetes objects (dicts).

Pure functions, like :mod:`cluster_assets.k8s.runtime`: the EKS stack installs what they return, the submit step
renders its per-job Job from here, and tests validate the same objects.

What runs, and why each piece is there:

* **Members**: a StatefulSet ``etcd`` of :data:`MEMBERS` pods in namespace :data:`ETCD_NAMESPACE`, on the system
  node group (never a GPU node's capacity), at most one per node (required pod anti-affinity: a lost node costs
  one member, never the majority), spread over zones where the node group spans several. ``Parallel`` pod
  management: the first member cannot become ready before a majority exists, so ordered start would wait forever.
  Stable names ``etcd-<i>.etcd.<ns>.svc`` through a headless Service that publishes members before they are ready
  (they must find each other to become ready).
* **Data**: one encrypted gp3 volume per member (:data:`STORAGE_CLASS`, the EBS CSI driver): a member that is
  rescheduled or restarted comes back with its raft log, users and roles, and rejoins as itself. Losing the
  majority's data would lose the authentication setup (a cluster with auth off is open to any certificate holder).
* **A lost volume repairs itself**: the member's container starts with the project's start-time repair
  (:mod:`training.launch.rendezvous.member_repair`, :func:`member_command`), which replaces itself with etcd. A
  member whose volume is new (its claim deleted, the volume lost) while the other two run removes its old entry,
  adds itself again and starts ``existing`` (as root: root's password and the administrative client certificate are
  mounted from :data:`ADMIN_SECRET`); with its data, or on the cluster's first start (no other member answers, or
  that Secret is not made yet), it starts as given. So the member image is the administration image
  (:data:`ADMIN_IMAGE_DIR`), which carries etcd's binary copied from the pinned ``versions.ETCD_IMAGE`` (that
  image itself has no shell or Python to run the repair in).
* **Disruptions**: a PodDisruptionBudget (``maxUnavailable: 1``): a drain, a node group update or the cluster
  autoscaler evicts one member at a time, so the majority, and every lease, survives them.
* **TLS and auth**: members require client certificates signed by the cluster's CA (``--client-cert-auth``), and
  speak TLS to each other; etcd authentication is on (``root``'s password in a Secret); each TrainJob logs in as
  its own user whose role reads and writes its own prefix. The material is made in the cluster by the project's own
  code (:mod:`cluster_assets.k8s.etcd_admin_job`, run by the ``etcd-bootstrap`` Job) and kept in Secrets; the
  ``etcd-cert-renewal`` CronJob re-issues member and client certificates before they expire (etcd reads its
  certificate files again for every new connection; the kubelet refreshes mounted Secrets within a minute or two).
* **Administration image**: the bootstrap Job, the renewal CronJob and every submit's add-job Job run
  :data:`ADMIN_IMAGE_DIR`'s small image (Python and three libraries), which the stack builds once as a CDK asset,
  never the training image: a training tag that is missing, pruned or emptied by ``make destroy`` cannot keep the
  members from their Secrets or the certificates from their renewal, and no system node pulls the multi-GB
  training image. The code they run (:data:`ADMIN_CODE`: the script and the project's etcd modules) comes from a
  ConfigMap, so a code change never rebuilds the image.
* **Network**: a NetworkPolicy admits to the client port only training pods (the TrainJobs' ``node`` pods, label
  :data:`cluster_facts.names.TRAINING_COMPONENT` in the training namespace), the administration pods, and the
  members themselves (peer and client ports).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Optional

from cluster_facts.names import COMPONENT_LABEL, TRAINING_COMPONENT
from cluster_facts.versions import BCRYPT_COST, WATCH_PROGRESS_FLAG, WATCH_PROGRESS_S

ETCD_NAMESPACE = "t5-etcd"
#: StatefulSet and headless Service name: members are ``etcd-<i>.etcd.<namespace>.svc``.
ETCD_NAME = "etcd"
MEMBERS = 3
CLIENT_PORT, PEER_PORT, PROBE_PORT = 2379, 2380, 2381
#: Pod labels (``t5-failover/component``): the members, and the pods that administer them.
ETCD_COMPONENT = "etcd"
ADMIN_COMPONENT = "etcd-admin"
STORAGE_CLASS = "t5-etcd-gp3"
#: Each member's volume: etcd's data is the raft log and a few KB of keys per job; the quota stays below it.
VOLUME_SIZE = "2Gi"
QUOTA_BACKEND_BYTES = 1 << 30
#: Secrets in the etcd namespace: the members' TLS material and JWT keys; root's credentials; the CA's key.
MEMBER_SECRET = "etcd-member-tls"
ADMIN_SECRET = "etcd-admin"
CA_SECRET = "etcd-ca"
#: Secret in the training namespace every training pod mounts: CA certificate and the agents' client certificate.
CLIENT_SECRET = "etcd-client"
#: The administration pods' service accounts (:func:`admin_rbac`): the stack's bootstrap and renewal; each job's
#: add-job.
BOOTSTRAP_SERVICE_ACCOUNT = "etcd-bootstrap"
ADD_JOB_SERVICE_ACCOUNT = "etcd-add-job"
ADMIN_SCRIPT_CONFIGMAP = "etcd-admin-script"
ADMIN_SCRIPT_DIR = "/opt/t5-etcd-admin"
ADMIN_SCRIPT = Path(__file__).with_name("etcd_admin_job.py")
_REPO = Path(__file__).resolve().parents[2]
#: The administration image's build context (Dockerfile + its pinned libraries); the stack builds it.
ADMIN_IMAGE_DIR = _REPO / "cluster_assets" / "etcd_admin_image"
#: What the administration pods run, from the ConfigMap: key -> (path under ADMIN_SCRIPT_DIR, source file). Only
#: the etcd modules the script imports (admin, certs, client), under their package path; ``training`` and
#: ``training.launch`` stay namespace packages there, so their heavy ``__init__`` (torch) is never imported.
ADMIN_CODE: dict[str, tuple[str, Path]] = {
    ADMIN_SCRIPT.name: (ADMIN_SCRIPT.name, ADMIN_SCRIPT),
    **{
        f"rendezvous.{module}": (
            f"training/launch/rendezvous/{module}",
            _REPO / "training" / "launch" / "rendezvous" / module,
        )
        for module in ("__init__.py", "admin.py", "certs.py", "client.py", "member_repair.py")
    },
}
#: The renewal CronJob's name: the submit reads the administration image from it (the stack's build of it).
RENEWAL_CRONJOB = "etcd-cert-renewal"
#: Where the training pods find the client Secret and their job's Secret.
CLIENT_MOUNT = "/var/run/t5-failover/etcd/client"
JOB_MOUNT = "/var/run/t5-failover/etcd/job"
#: Keys of the Secrets (file names where they are mounted).
CA_CERT, CLIENT_CERT, CLIENT_KEY, PASSWORD = "ca.crt", "client.crt", "client.key", "password"
#: etcd's election timing: heartbeat 100 ms, election 1 s, as the tests run it (members.py): a lost leader is
#: replaced in about a second, far inside the agents' lease TTL.
HEARTBEAT_MS, ELECTION_MS = 100, 1000
RENEWAL_SCHEDULE = "17 3 1 * *"  # monthly; the certificates are valid a year and renewed with 90 days left
MEMBER_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
ADMIN_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
#: Non-root user of the members (distroless's "nonroot"); fsGroup makes the volume and the Secrets readable.
MEMBER_UID = 65532
#: In the member container: etcd's binary (the administration image copies it from ETCD_IMAGE), its data
#: directory, its TLS material, and root's credentials (for the start-time repair's membership changes).
ETCD_BIN = "/usr/local/bin/etcd"
DATA_DIR = "/var/lib/etcd/data"
MEMBER_TLS = "/etc/etcd/tls"
ADMIN_CREDENTIALS_DIR = "/etc/etcd/admin"
#: Seconds the start-time repair retries a membership change the others cannot make yet: inside the liveness
#: probe's first minute (10 s delay + 6 x 10 s), after which the kubelet starts the container again anyway.
REPAIR_WAIT_S = 45


def member_names() -> list[str]:
    return [f"{ETCD_NAME}-{i}" for i in range(MEMBERS)]


def member_host(member: str, namespace: str = ETCD_NAMESPACE) -> str:
    return f"{member}.{ETCD_NAME}.{namespace}.svc"


def endpoints(namespace: str = ETCD_NAMESPACE) -> list[str]:
    """The members' client URLs, as the agents are given them (``T5_ETCD_ENDPOINTS``)."""
    return [f"https://{member_host(m, namespace)}:{CLIENT_PORT}" for m in member_names()]


def member_cert_hosts(namespace: str = ETCD_NAMESPACE) -> list[str]:
    """Names the one member certificate is valid for: every member's, short and long, and loopback (probes and a
    port-forward)."""
    hosts = []
    for m in member_names():
        hosts += [member_host(m, namespace), f"{member_host(m, namespace)}.cluster.local"]
    return hosts + [f"{ETCD_NAME}.{namespace}.svc", "localhost", "127.0.0.1"]


def job_secret_name(trainjob: str) -> str:
    """The Secret holding one TrainJob's etcd password, in the training namespace (made by the submit step)."""
    return f"{trainjob}-etcd"


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "t5-failover", COMPONENT_LABEL: component}


# ------------------------------------------------------------------------------------------- the members
def namespace_manifest(namespace: str = ETCD_NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {"app.kubernetes.io/part-of": "t5-failover"}},
    }


def storage_class() -> dict[str, Any]:
    """Encrypted gp3 volumes, created in the zone where the member's pod is scheduled."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "labels": {"app.kubernetes.io/part-of": "t5-failover"}},
        "provisioner": "ebs.csi.aws.com",
        "parameters": {"type": "gp3", "encrypted": "true"},
        # A volume lives in one zone: create it where the member landed, not before.
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": True,
    }


def headless_service(namespace: str = ETCD_NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": ETCD_NAME, "namespace": namespace, "labels": _labels(ETCD_COMPONENT)},
        "spec": {
            "clusterIP": "None",
            # Members must resolve each other before any is ready (readiness needs a majority).
            "publishNotReadyAddresses": True,
            "selector": {COMPONENT_LABEL: ETCD_COMPONENT},
            "ports": [
                {"name": "client", "port": CLIENT_PORT, "targetPort": CLIENT_PORT, "protocol": "TCP"},
                {"name": "peer", "port": PEER_PORT, "targetPort": PEER_PORT, "protocol": "TCP"},
            ],
        },
    }


def member_args(namespace: str = ETCD_NAMESPACE) -> list[str]:
    """etcd's flags; ``$(POD_NAME)`` is expanded by the kubelet (the image has no shell)."""
    tls = MEMBER_TLS
    me = f"$(POD_NAME).{ETCD_NAME}.{namespace}.svc"
    cluster = ",".join(f"{m}=https://{member_host(m, namespace)}:{PEER_PORT}" for m in member_names())
    return [
        "--name=$(POD_NAME)",
        f"--data-dir={DATA_DIR}",
        f"--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls=https://{me}:{CLIENT_PORT}",
        f"--listen-peer-urls=https://0.0.0.0:{PEER_PORT}",
        f"--initial-advertise-peer-urls=https://{me}:{PEER_PORT}",
        # Ignored once the data directory exists: a restarted member rejoins as itself. A member without data whose
        # cluster runs gets both replaced by member_command's repair ("existing", the cluster as it is now).
        f"--initial-cluster={cluster}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={namespace}",
        f"--listen-metrics-urls=http://0.0.0.0:{PROBE_PORT}",
        f"--heartbeat-interval={HEARTBEAT_MS}",
        f"--election-timeout={ELECTION_MS}",
        # progress notices to idle watches well inside the agents' 15 s watch timeout: without them every agent
        # re-reads and re-watches every 15 s
        f"{WATCH_PROGRESS_FLAG}={WATCH_PROGRESS_S}s",
        f"--cert-file={tls}/tls.crt",
        f"--key-file={tls}/tls.key",
        f"--trusted-ca-file={tls}/{CA_CERT}",
        "--client-cert-auth",
        f"--peer-cert-file={tls}/tls.crt",
        f"--peer-key-file={tls}/tls.key",
        f"--peer-trusted-ca-file={tls}/{CA_CERT}",
        "--peer-client-cert-auth",
        # JWT tokens signed by one key pair: any member accepts a token another issued (members.py does the same).
        f"--auth-token=jwt,pub-key={tls}/jwt.pub,priv-key={tls}/jwt.key,sign-method=ES256,ttl=10m",
        # random passwords: the cheapest hash gives nothing away and makes 1,024 logins cheap (cluster_facts)
        f"--bcrypt-cost={BCRYPT_COST}",
        # Membership writes a few keys per round: keep an hour of history, and a quota below the volume's size.
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1h",
        f"--quota-backend-bytes={QUOTA_BACKEND_BYTES}",
        "--log-level=warn",
    ]


def member_command(namespace: str = ETCD_NAMESPACE) -> list[str]:
    """The member container's command, before :func:`member_args`: the start-time repair (a member without data
    rejoins the running cluster), run from the ConfigMap's code, which then replaces itself with etcd."""
    return [
        "python",
        "-m",
        "training.launch.rendezvous.member_repair",
        "--name=$(POD_NAME)",
        f"--peer-url=https://$(POD_NAME).{ETCD_NAME}.{namespace}.svc:{PEER_PORT}",
        f"--data-dir={DATA_DIR}",
        f"--endpoints={','.join(endpoints(namespace))}",
        # root's: the member's own certificate names it as common name, which etcd refuses on the JSON gateway
        f"--ca={ADMIN_CREDENTIALS_DIR}/{CA_CERT}",
        f"--cert={ADMIN_CREDENTIALS_DIR}/{CLIENT_CERT}",
        f"--key={ADMIN_CREDENTIALS_DIR}/{CLIENT_KEY}",
        f"--password-file={ADMIN_CREDENTIALS_DIR}/{PASSWORD}",
        f"--wait-s={REPAIR_WAIT_S}",
        "--",
        ETCD_BIN,
    ]


def statefulset(
    *, image: str, namespace: str = ETCD_NAMESPACE, node_selector: Optional[Mapping[str, str]] = None
) -> dict[str, Any]:
    """The members (see the module docstring); ``image``: the administration image (Python, the repair's
    libraries and etcd's binary)."""
    selector = {COMPONENT_LABEL: ETCD_COMPONENT}
    probe = {
        "httpGet": {"path": "/readyz", "port": PROBE_PORT, "scheme": "HTTP"},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    container = {
        "name": "etcd",
        "image": image,
        "command": member_command(namespace),
        "args": member_args(namespace),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            # the ConfigMap's code as a package tree (training.launch.rendezvous.member_repair)
            {"name": "PYTHONPATH", "value": ADMIN_SCRIPT_DIR},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [
            {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
            {"name": "probe", "containerPort": PROBE_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": probe,
        # A member that lost its majority is not dead: only restart one that stopped answering for a minute.
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": PROBE_PORT, "scheme": "HTTP"},
            "periodSeconds": 10,
            "failureThreshold": 6,
            "initialDelaySeconds": 10,
        },
        "resources": {k: dict(v) for k, v in MEMBER_RESOURCES.items()},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/etcd"},
            {"name": "tls", "mountPath": MEMBER_TLS, "readOnly": True},
            {"name": "admin-credentials", "mountPath": ADMIN_CREDENTIALS_DIR, "readOnly": True},
            {"name": "script", "mountPath": ADMIN_SCRIPT_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": MEMBER_UID,
            "runAsGroup": MEMBER_UID,
            "fsGroup": MEMBER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": dict(selector)},
            }
        ],
        "containers": [container],
        # 0440 + fsGroup: readable by the non-root member, by no one else.
        "volumes": [
            {"name": "tls", "secret": {"secretName": MEMBER_SECRET, "defaultMode": 0o440}},
            # root's credentials, for the repair's membership changes. Optional: the bootstrap Job makes them only
            # once the members run (until then it is the cluster's first start, which needs no repair). Nothing
            # gained over the member's own Secret, whose token-signing key could mint root a token anyway.
            {
                "name": "admin-credentials",
                "secret": {"secretName": ADMIN_SECRET, "optional": True, "defaultMode": 0o440},
            },
            _script_volume(),
        ],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": ETCD_NAME, "namespace": namespace, "labels": _labels(ETCD_COMPONENT)},
        "spec": {
            "serviceName": ETCD_NAME,
            "replicas": MEMBERS,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": dict(selector)},
            "updateStrategy": {"type": "RollingUpdate"},
            # Deleting the StatefulSet (cdk destroy) deletes its claims, and so the EBS volumes (reclaimPolicy
            # Delete); scaling down keeps a member's volume for when it comes back.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "template": {"metadata": {"labels": _labels(ETCD_COMPONENT)}, "spec": pod_spec},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": STORAGE_CLASS,
                        "resources": {"requests": {"storage": VOLUME_SIZE}},
                    },
                }
            ],
        },
    }


def disruption_budget(namespace: str = ETCD_NAMESPACE) -> dict[str, Any]:
    """One member down at most for voluntary disruptions (drains, node group updates, scale-down)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": ETCD_NAME, "namespace": namespace, "labels": _labels(ETCD_COMPONENT)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {COMPONENT_LABEL: ETCD_COMPONENT}}},
    }


def network_policy(*, training_namespace: str, namespace: str = ETCD_NAMESPACE) -> dict[str, Any]:
    """The members accept: the client port from training pods of the training namespace and from the
    administration pods; both ports from each other. Nothing else (the kubelet's probes come from the node, which
    NetworkPolicies always allow)."""
    members = {"podSelector": {"matchLabels": {COMPONENT_LABEL: ETCD_COMPONENT}}}
    client = [{"protocol": "TCP", "port": CLIENT_PORT}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "etcd-from-training-pods", "namespace": namespace, "labels": _labels(ETCD_COMPONENT)},
        "spec": {
            **members,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [members], "ports": [*client, {"protocol": "TCP", "port": PEER_PORT}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": training_namespace}},
                            "podSelector": {"matchLabels": {COMPONENT_LABEL: TRAINING_COMPONENT}},
                        }
                    ],
                    "ports": client,
                },
                {"from": [{"podSelector": {"matchLabels": {COMPONENT_LABEL: ADMIN_COMPONENT}}}], "ports": client},
            ],
        },
    }


# ------------------------------------------------------------------------------------ administration
def _secret_rules(*, named: list[str], verbs: list[str], create: bool) -> list[dict[str, Any]]:
    """``verbs`` on the Secrets ``named`` only; ``create`` on Secrets of any name (Kubernetes cannot limit a create
    by name: the name is not known when the request is authorized)."""
    rules: list[dict[str, Any]] = []
    if named:
        rules.append({"apiGroups": [""], "resources": ["secrets"], "resourceNames": list(named), "verbs": verbs})
    if create:
        rules.append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
    return rules


def admin_rbac(*, training_namespace: str, namespace: str = ETCD_NAMESPACE) -> list[dict[str, Any]]:
    """Two service accounts, each with the Secrets its Jobs touch and nothing else (no pods, no cluster scope):

    * :data:`BOOTSTRAP_SERVICE_ACCOUNT` (the stack's ``etcd-bootstrap`` Job and ``etcd-cert-renewal`` CronJob): the
      CA and its key, the members' certificate and token-signing key, root's password and administrative
      certificate (etcd namespace), the agents' client certificate (training namespace); creates them once,
      updates them on renewal.
    * :data:`ADD_JOB_SERVICE_ACCOUNT` (each submit's add-job Job): reads root's password and the administrative
      certificate (etcd allows user and role management to root only), never the CA key or the members' keys
      (with the token-signing key anyone could mint a token for any user); writes the jobs' own password Secrets
      in the training namespace.
    """
    ns_objects: list[dict[str, Any]] = []
    grants = {
        BOOTSTRAP_SERVICE_ACCOUNT: {
            namespace: _secret_rules(
                named=[CA_SECRET, MEMBER_SECRET, ADMIN_SECRET], verbs=["get", "update"], create=True
            ),
            training_namespace: _secret_rules(named=[CLIENT_SECRET], verbs=["get", "update"], create=True),
        },
        ADD_JOB_SERVICE_ACCOUNT: {
            namespace: _secret_rules(named=[ADMIN_SECRET], verbs=["get"], create=False),
            # each job's "<name>-etcd": names unknown in advance; update replaces an earlier job's of that name
            training_namespace: [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "update"]}],
        },
    }
    for account, by_namespace in grants.items():
        ns_objects.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": namespace, "labels": _labels(ADMIN_COMPONENT)},
            }
        )
        name = f"t5-{account}"
        for ns, rules in by_namespace.items():
            meta = {"name": name, "namespace": ns, "labels": _labels(ADMIN_COMPONENT)}
            ns_objects.append(
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules}
            )
            ns_objects.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": dict(meta),
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
                }
            )
    return ns_objects


def admin_script_configmap(namespace: str = ETCD_NAMESPACE) -> dict[str, Any]:
    """The administration script (:mod:`cluster_assets.k8s.etcd_admin_job`) and the etcd modules it imports
    (:data:`ADMIN_CODE`), mounted into the administration image, which carries only their libraries."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ADMIN_SCRIPT_CONFIGMAP, "namespace": namespace, "labels": _labels(ADMIN_COMPONENT)},
        "data": {key: source.read_text() for key, (_, source) in ADMIN_CODE.items()},
    }


def _admin_code_digest() -> bytes:
    return b"".join(source.read_bytes() for _, source in ADMIN_CODE.values())


def _admin_pod_spec(
    *,
    service_account: str,
    admin_image: str,
    args: list[str],
    training_namespace: str,
    namespace: str,
    node_selector: Optional[Mapping[str, str]],
) -> dict[str, Any]:
    env = {
        "T5_ETCD_NAMESPACE": namespace,
        "T5_TRAINING_NAMESPACE": training_namespace,
        "T5_ETCD_ENDPOINTS": ",".join(endpoints(namespace)),
        "T5_ETCD_CERT_HOSTS": ",".join(member_cert_hosts(namespace)),
        "PYTHONUNBUFFERED": "1",
    }
    spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "restartPolicy": "OnFailure",
        "containers": [
            {
                "name": "admin",
                "image": admin_image,
                "command": ["python", f"{ADMIN_SCRIPT_DIR}/{ADMIN_SCRIPT.name}", *args],
                "env": [{"name": k, "value": v} for k, v in env.items()],
                "resources": {k: dict(v) for k, v in ADMIN_RESOURCES.items()},
                # the image's user is distroless's "nonroot"; refuse to start any other image as root
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "script", "mountPath": ADMIN_SCRIPT_DIR, "readOnly": True}],
            }
        ],
        "volumes": [_script_volume()],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return spec


def _script_volume() -> dict[str, Any]:
    """The ConfigMap's code as files under :data:`ADMIN_SCRIPT_DIR` (administration pods and members)."""
    return {
        "name": "script",
        "configMap": {
            "name": ADMIN_SCRIPT_CONFIGMAP,
            "items": [{"key": key, "path": path} for key, (path, _) in ADMIN_CODE.items()],
        },
    }


def _admin_job(
    name: str,
    *,
    service_account: str,
    admin_image: str,
    args: list[str],
    training_namespace: str,
    namespace: str,
    node_selector: Optional[Mapping[str, str]],
    backoff_limit: int,
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(ADMIN_COMPONENT)},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": _labels(ADMIN_COMPONENT)},
                "spec": _admin_pod_spec(
                    service_account=service_account,
                    admin_image=admin_image,
                    args=args,
                    training_namespace=training_namespace,
                    namespace=namespace,
                    node_selector=node_selector,
                ),
            },
        },
    }


def bootstrap_job(
    *,
    admin_image: str,
    training_namespace: str,
    namespace: str = ETCD_NAMESPACE,
    node_selector: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """Makes the TLS material and root's password once (never replaces existing Secrets), waits for the members,
    turns authentication on once. Its name carries a digest of its spec and of the code it mounts: a Job's pod
    template cannot change, so a redeploy with another image or code creates a new Job (which finds everything in
    place and only checks it)."""
    job = _admin_job(
        "etcd-bootstrap",
        service_account=BOOTSTRAP_SERVICE_ACCOUNT,
        admin_image=admin_image,
        args=["bootstrap"],
        training_namespace=training_namespace,
        namespace=namespace,
        node_selector=node_selector,
        backoff_limit=30,
    )
    digest = hashlib.sha256(json.dumps(job["spec"], sort_keys=True).encode() + _admin_code_digest()).hexdigest()[:8]
    job["metadata"]["name"] = f"etcd-bootstrap-{digest}"
    return job


def renewal_cronjob(
    *,
    admin_image: str,
    training_namespace: str,
    namespace: str = ETCD_NAMESPACE,
    node_selector: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """Monthly: re-issue the member and client certificates that expire within 90 days (same CA)."""
    pod = _admin_pod_spec(
        service_account=BOOTSTRAP_SERVICE_ACCOUNT,
        admin_image=admin_image,
        args=["renew"],
        training_namespace=training_namespace,
        namespace=namespace,
        node_selector=node_selector,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": RENEWAL_CRONJOB, "namespace": namespace, "labels": _labels(ADMIN_COMPONENT)},
        "spec": {
            "schedule": RENEWAL_SCHEDULE,
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {
                "spec": {"backoffLimit": 3, "template": {"metadata": {"labels": _labels(ADMIN_COMPONENT)}, "spec": pod}}
            },
        },
    }


def add_job_job(
    trainjob: str,
    *,
    admin_image: str,
    training_namespace: str,
    namespace: str = ETCD_NAMESPACE,
    node_selector: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """The submit step's Job: (re)create TrainJob ``trainjob``'s etcd user and role, clear its key prefix, store its
    password in Secret :func:`job_secret_name` of the training namespace."""
    job = _admin_job(
        f"etcd-add-{trainjob}"[:63],
        service_account=ADD_JOB_SERVICE_ACCOUNT,
        admin_image=admin_image,
        args=["add-job", "--job", trainjob],
        training_namespace=training_namespace,
        namespace=namespace,
        node_selector=node_selector,
        backoff_limit=2,
    )
    job["spec"]["ttlSecondsAfterFinished"] = 600  # its log is read by the submit at once; nothing to keep
    return job


def cluster_objects(
    *,
    admin_image: str,
    training_namespace: str,
    namespace: str = ETCD_NAMESPACE,
    node_selector: Optional[Mapping[str, str]] = None,
) -> dict[str, list[dict[str, Any]]]:
    """Everything the stack installs, grouped in creation order: the namespace first, the members (with the
    ConfigMap of the code they and the administration pods run), then the administration (which needs the members'
    namespace and the training namespace)."""
    return {
        "namespace": [namespace_manifest(namespace)],
        "members": [
            storage_class(),
            headless_service(namespace),
            disruption_budget(namespace),
            network_policy(training_namespace=training_namespace, namespace=namespace),
            admin_script_configmap(namespace),  # the members run its repair module at every start
            statefulset(image=admin_image, namespace=namespace, node_selector=node_selector),
        ],
        "admin": [
            *admin_rbac(training_namespace=training_namespace, namespace=namespace),
            bootstrap_job(
                admin_image=admin_image,
                training_namespace=training_namespace,
                namespace=namespace,
                node_selector=node_selector,
            ),
            renewal_cronjob(
                admin_image=admin_image,
                training_namespace=training_namespace,
                namespace=namespace,
                node_selector=node_selector,
            ),
        ],
    }
