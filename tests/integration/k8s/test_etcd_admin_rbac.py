"""Who may read the EKS etcd's secrets (issue #53 item 5): the stack's bootstrap and renewal identity holds the CA
key, the members' keys and root's password; a submission's add-job identity reads root's password only and writes
job password Secrets; each API call the administration script really makes is allowed to the identity that runs
it (the rendered Roles, evaluated as Kubernetes' RBAC authorizer does for namespaced Secrets)."""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import urlparse

import pytest

from cluster_assets.k8s import etcd, etcd_admin_job
from tests.support.apiserver_stub import Stub

RBAC = etcd.admin_rbac(training_namespace="training")
HOSTS = etcd.member_cert_hosts()
VERB = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}


def allowed(account: str, verb: str, namespace: str, name: str) -> bool:
    """Kubernetes' RBAC for one Secret request by service account ``account`` of the etcd namespace."""
    for binding in (o for o in RBAC if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == namespace):
        if {"kind": "ServiceAccount", "name": account, "namespace": etcd.ETCD_NAMESPACE} not in binding["subjects"]:
            continue
        (role,) = [
            o
            for o in RBAC
            if o["kind"] == "Role"
            and o["metadata"] == {**o["metadata"], "name": binding["roleRef"]["name"], "namespace": namespace}
        ]
        for rule in role["rules"]:
            names = rule.get("resourceNames")
            if "secrets" in rule["resources"] and verb in rule["verbs"] and (not names or name in names):
                return True
    return False


class Recorded:
    """The SecretStore's HTTP session, recording (verb, namespace, name) of every request it sends."""

    def __init__(self, session: Any) -> None:
        self.session, self.calls = session, []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.session, attr)

    def _record(self, method: str, url: str, **kw: Any) -> Any:
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?", urlparse(url).path)
        self.calls.append((VERB[method], m[1], m[2] or kw["json"]["metadata"]["name"]))
        return getattr(self.session, method.lower())(url, **kw)

    def get(self, url: str, **kw: Any) -> Any:
        return self._record("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Any:
        return self._record("POST", url, **kw)

    def put(self, url: str, **kw: Any) -> Any:
        return self._record("PUT", url, **kw)


@pytest.fixture()
def store():
    stub = Stub()
    stub.secrets.clear()
    secrets = etcd_admin_job.SecretStore(base_url=stub.url, token="t")
    secrets.session = Recorded(secrets.session)
    yield stub, secrets
    stub.close()


def test_who_may_read_the_ca_key_the_members_keys_and_roots_password():
    boot, add = etcd.BOOTSTRAP_SERVICE_ACCOUNT, etcd.ADD_JOB_SERVICE_ACCOUNT
    for secret in (etcd.CA_SECRET, etcd.MEMBER_SECRET, etcd.ADMIN_SECRET):
        assert allowed(boot, "get", "t5-etcd", secret)
    assert allowed(boot, "get", "training", etcd.CLIENT_SECRET)
    # the add-job identity: root's password (user management is root's), never the CA key or the token-signing key
    assert allowed(add, "get", "t5-etcd", etcd.ADMIN_SECRET)
    assert not allowed(add, "get", "t5-etcd", etcd.CA_SECRET) and not allowed(add, "get", "t5-etcd", etcd.MEMBER_SECRET)
    assert not allowed(add, "update", "t5-etcd", etcd.ADMIN_SECRET)
    assert not any(allowed(add, "get", "training", s) for s in (etcd.CLIENT_SECRET, "t5-a-etcd"))
    # nobody lists or deletes Secrets; the pods of each identity are the stack's
    assert not any(
        allowed(a, v, ns, "x") for a in (boot, add) for v in ("list", "delete") for ns in ("t5-etcd", "training")
    )
    pods = {
        "bootstrap": etcd.bootstrap_job(admin_image="i:1", training_namespace="training")["spec"]["template"]["spec"],
        "renewal": etcd.renewal_cronjob(admin_image="i:1", training_namespace="training")["spec"]["jobTemplate"][
            "spec"
        ]["template"]["spec"],
        "add-job": etcd.add_job_job("t5-a", admin_image="i:1", training_namespace="training")["spec"]["template"][
            "spec"
        ],
    }
    assert {k: p["serviceAccountName"] for k, p in pods.items()} == {"bootstrap": boot, "renewal": boot, "add-job": add}


def test_bootstrap_and_renewal_need_nothing_beyond_their_role(store, tmp_path):
    stub, secrets = store
    etcd_admin_job.ensure_material(secrets, "t5-etcd", "training", HOSTS, str(tmp_path / "a"))
    etcd_admin_job.ensure_material(secrets, "t5-etcd", "training", HOSTS, str(tmp_path / "b"))  # a rerun
    etcd_admin_job.renew(secrets, "t5-etcd", "training", HOSTS, str(tmp_path / "c"), within_days=400)
    calls = secrets.session.calls
    assert {v for v, _, _ in calls} == {"get", "create", "update"}
    assert [c for c in calls if not allowed(etcd.BOOTSTRAP_SERVICE_ACCOUNT, *c)] == []


def test_add_job_needs_nothing_beyond_its_role(store, tmp_path):
    """Against a real 3-member etcd: the add-job reads root's Secret and writes the job's, twice (a resubmission
    of the same name replaces its password Secret)."""
    from training.launch.rendezvous.members import LocalEtcd

    stub, secrets = store
    with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
        root = cluster.root_credentials()
        files = {"ca.crt": root.ca, "client.crt": root.cert, "client.key": root.key, "password": root.password_file}
        data = {k: base64.b64encode(open(v, "rb").read()).decode() for k, v in files.items()}
        stub.secret_data[("t5-etcd", etcd.ADMIN_SECRET)] = {"data": data}
        for _ in range(2):
            creds = etcd_admin_job.root_credentials(secrets, "t5-etcd", cluster.endpoints, str(tmp_path / "w"))
            etcd_admin_job.add_job(secrets, creds, "t5-a", "training", str(tmp_path / "w"))
    calls = secrets.session.calls
    assert ("update", "training", "t5-a-etcd") in calls  # the second submission replaced it
    assert [c for c in calls if not allowed(etcd.ADD_JOB_SERVICE_ACCOUNT, *c)] == []
