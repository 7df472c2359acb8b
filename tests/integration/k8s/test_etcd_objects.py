"""The EKS cluster's etcd: the rendered objects (valid against the kubernetes client's models, shaped for a majority
that survives any one node) and the administration script the cluster runs (against a real etcd here)."""

from __future__ import annotations

import base64

import pytest

from cluster_assets.k8s import etcd, etcd_admin_job
from tests.support.apiserver_stub import Stub


# ------------------------------------------------------------------------------- the admin script, for real
@pytest.fixture()
def store():
    stub = Stub()
    stub.secrets.clear()
    yield stub, etcd_admin_job.SecretStore(base_url=stub.url, token="t")
    stub.close()


def decoded(stub: Stub, ns: str, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in stub.secret_data[(ns, name)]["data"].items()}


def test_bootstrap_material_is_made_once_and_fits_the_members(store, tmp_path):
    from cryptography import x509

    stub, secrets = store
    hosts = etcd.member_cert_hosts()
    etcd_admin_job.ensure_material(secrets, "t5-etcd", "training", hosts, str(tmp_path / "a"))
    made = {k: dict(v) for k, v in stub.secret_data.items()}
    assert set(made) == {
        ("t5-etcd", "etcd-ca"),
        ("t5-etcd", "etcd-member-tls"),
        ("t5-etcd", "etcd-admin"),
        ("training", "etcd-client"),
    }
    etcd_admin_job.ensure_material(secrets, "t5-etcd", "training", hosts, str(tmp_path / "b"))
    assert stub.secret_data == made  # a rerun replaces nothing
    member = x509.load_pem_x509_certificate(decoded(stub, "t5-etcd", "etcd-member-tls")["tls.crt"])
    names = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert {e.split("//")[1].rsplit(":", 1)[0] for e in etcd.endpoints()} <= set(names)
    client = x509.load_pem_x509_certificate(decoded(stub, "training", "etcd-client")["client.crt"])
    assert not client.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)  # etcd's gateway rule
    ca = decoded(stub, "t5-etcd", "etcd-ca")["ca.crt"]
    assert decoded(stub, "training", "etcd-client")["ca.crt"] == ca
    assert len(decoded(stub, "t5-etcd", "etcd-admin")["password"]) >= 32


def test_renewal_reissues_from_the_same_ca(store, tmp_path):
    stub, secrets = store
    hosts = etcd.member_cert_hosts()
    etcd_admin_job.ensure_material(secrets, "t5-etcd", "training", hosts, str(tmp_path / "a"))
    before = decoded(stub, "training", "etcd-client")
    assert etcd_admin_job.renew(secrets, "t5-etcd", "training", hosts, str(tmp_path / "b")) == []  # a year left
    renewed = etcd_admin_job.renew(secrets, "t5-etcd", "training", hosts, str(tmp_path / "c"), within_days=400)
    assert renewed == ["t5-etcd/etcd-member-tls", "t5-etcd/etcd-admin", "training/etcd-client"]
    after = decoded(stub, "training", "etcd-client")
    assert after["client.crt"] != before["client.crt"] and after["ca.crt"] == before["ca.crt"]
    assert decoded(stub, "t5-etcd", "etcd-admin")["password"]  # root's password kept


def test_add_job_gives_each_job_a_clean_prefix_and_its_own_password(store, tmp_path):
    """Against a real 3-member etcd (auth on): the add-job step clears what an earlier job of the same name left,
    stores the new user's password in the job's Secret, and that password reaches the job's prefix only."""
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused
    from training.launch.rendezvous.members import LocalEtcd

    stub, secrets = store
    with LocalEtcd.start(str(tmp_path / "etcd")) as cluster:
        root = cluster.root_credentials()
        read = lambda p: open(p, "rb").read()  # noqa: E731
        secrets.put(
            "t5-etcd",
            "etcd-admin",
            {
                "ca.crt": read(root.ca),
                "client.crt": read(root.cert),
                "client.key": read(root.key),
                "password": read(root.password_file),
            },
        )
        creds = etcd_admin_job.root_credentials(secrets, "t5-etcd", cluster.endpoints, str(tmp_path / "w"))
        assert etcd_admin_job.enable_auth_once(creds).startswith("authentication was on already")
        EtcdClient(creds).put("/t5-failover/jobs/t5-a/rdzv/old/closed", "1")  # a finished job of that name
        line = etcd_admin_job.add_job(secrets, creds, "t5-a", "training", str(tmp_path / "w"))
        assert line == "etcd user job-t5-a: read/write /t5-failover/jobs/t5-a/; password in Secret training/t5-a-etcd"
        password = tmp_path / "pw"
        password.write_bytes(decoded(stub, "training", "t5-a-etcd")["password"])
        job = EtcdClient(
            ClientCredentials(
                tuple(cluster.endpoints),
                root.ca,
                root.cert,
                root.key,
                "job-t5-a",
                str(password),
                "/t5-failover/jobs/t5-a/",
            )
        )
        assert job.get_prefix("/t5-failover/jobs/t5-a/")[0] == []  # cleared
        job.put(job.key("x"), "1")
        with pytest.raises(StoreRefused, match="permission denied"):
            job.put("/t5-failover/jobs/t5-b/x", "1")
