"""Administer the EKS cluster's etcd from inside the cluster: TLS material, authentication, each job's user.

Runs in the stack's small administration image (Python, ``requests``, ``cryptography``:
cluster_assets/etcd_admin_image/), from a ConfigMap the stack mounts with the project's etcd modules it imports
(``training.launch.rendezvous`` admin, certs, client: :data:`cluster_assets.k8s.etcd.ADMIN_CODE`). ``bootstrap``
and ``renew`` run as service account ``etcd-bootstrap`` (the etcd namespace's Secrets and the agents' client
Secret), ``add-job`` as ``etcd-add-job`` (root's Secret read-only, the jobs' password Secrets): nothing else, and
neither reads what the other needs (:func:`cluster_assets.k8s.etcd.admin_rbac`). Only the
standard library, those two libraries and those modules are imported here: ``cluster_assets`` is not mounted.

    python etcd_admin_job.py bootstrap          # the stack's etcd-bootstrap Job
    python etcd_admin_job.py renew              # the etcd-cert-renewal CronJob
    python etcd_admin_job.py add-job --job NAME # the submit step's Job, one per TrainJob

* ``bootstrap``: makes whatever Secret is missing (never replaces one): the CA (``etcd-ca``), the members'
  certificate and JWT keys (``etcd-member-tls``), root's password and an administrative client certificate
  (``etcd-admin``), the agents' client certificate (``etcd-client`` in the training namespace); then waits for
  the members and turns etcd's authentication on, once (a cluster where it is on already is only checked).
* ``renew``: re-issues, from the same CA, the member and client certificates that expire within 90 days.
* ``add-job``: deletes what an earlier TrainJob of the same name left under its prefix, (re)creates its etcd user
  and role (:class:`training.launch.rendezvous.admin.EtcdAdmin`), and stores the password in Secret
  ``<name>-etcd`` of the training namespace, which the TrainJob mounts.

Settings come from the environment the Job sets: T5_ETCD_NAMESPACE, T5_TRAINING_NAMESPACE, T5_ETCD_ENDPOINTS,
T5_ETCD_CERT_HOSTS. Exit codes: 0 done, 1 a step failed (the Job retries), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import secrets
import sys
import tempfile
import time

# Secret names and keys; cluster_assets/k8s/etcd.py renders the objects that mount them with the same names (a
# test checks that the two agree).
CA_SECRET, MEMBER_SECRET, ADMIN_SECRET, CLIENT_SECRET = "etcd-ca", "etcd-member-tls", "etcd-admin", "etcd-client"
CA_CERT, CLIENT_CERT, CLIENT_KEY, PASSWORD = "ca.crt", "client.crt", "client.key", "password"
RENEW_WITHIN_DAYS = 90
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def job_secret_name(trainjob: str) -> str:
    return f"{trainjob}-etcd"


def say(line: str) -> None:
    print(f"[etcd-admin] {line}", flush=True)


class SecretStore:
    """Secrets through the Kubernetes API (the pod's service account); ``base_url`` and ``token`` for tests."""

    def __init__(self, base_url: str | None = None, token: str | None = None, verify: str | bool | None = None):
        import requests

        self.session = requests.Session()
        self.session.trust_env = False
        if base_url is None:
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
            base_url = f"https://{host}:{port}"
            with open(f"{SA_DIR}/token") as f:
                token = f.read().strip()
            verify = f"{SA_DIR}/ca.crt"
        self.base = base_url.rstrip("/")
        self.session.headers["Authorization"] = f"Bearer {token}" if token else ""
        self.verify = True if verify is None else verify

    def _url(self, namespace: str, name: str = "") -> str:
        return f"{self.base}/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")

    def get(self, namespace: str, name: str) -> dict[str, bytes] | None:
        r = self.session.get(self._url(namespace, name), verify=self.verify, timeout=30)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return {k: base64.b64decode(v) for k, v in (r.json().get("data") or {}).items()}

    def put(self, namespace: str, name: str, data: dict[str, bytes], replace: bool = False) -> None:
        """Create the Secret; with ``replace``, update it if it exists."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "t5-failover"}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        r = self.session.post(self._url(namespace), json=body, verify=self.verify, timeout=30)
        if r.status_code == 409 and replace:
            r = self.session.put(self._url(namespace, name), json=body, verify=self.verify, timeout=30)
        r.raise_for_status()


# ------------------------------------------------------------------------------------------- material
def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(directory: str, name: str, data: bytes) -> str:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _ca(store: SecretStore, ns: str, work: str):
    """The cluster's CA: the stored one, else a new one stored now (before anything it signs)."""
    from training.launch.rendezvous.certs import CertificateAuthority, CertPaths

    stored = store.get(ns, CA_SECRET)
    if stored is None:
        ca = CertificateAuthority.create(work)
        store.put(ns, CA_SECRET, {"ca.crt": _read(ca.paths.cert), "ca.key": _read(ca.paths.key)})
        say(f"made the CA (Secret {ns}/{CA_SECRET})")
        return ca
    return CertificateAuthority(
        CertPaths(_write(work, "ca.crt", stored["ca.crt"]), _write(work, "ca.key", stored["ca.key"]))
    )


def _member_material(ca, work: str, hosts: list[str]) -> dict[str, bytes]:
    from training.launch.rendezvous.certs import jwt_key_pair

    cert = ca.issue("etcd-member", work, hosts=hosts)
    public, private = jwt_key_pair(work)
    return {
        CA_CERT: _read(ca.paths.cert),
        "tls.crt": _read(cert.cert),
        "tls.key": _read(cert.key),
        "jwt.pub": _read(public),
        "jwt.key": _read(private),
    }


def _client_material(ca, work: str, name: str) -> dict[str, bytes]:
    """A client certificate (no common name: etcd refuses gateway requests whose certificate has one)."""
    cert = ca.issue(name, work)
    return {CA_CERT: _read(ca.paths.cert), CLIENT_CERT: _read(cert.cert), CLIENT_KEY: _read(cert.key)}


def ensure_material(store: SecretStore, ns: str, training_ns: str, hosts: list[str], work: str) -> None:
    """Make every missing Secret; an existing one is kept as it is (a rerun changes nothing)."""
    ca = _ca(store, ns, work)
    if store.get(ns, MEMBER_SECRET) is None:
        store.put(ns, MEMBER_SECRET, _member_material(ca, work, hosts))
        say(f"made the members' certificate and token keys (Secret {ns}/{MEMBER_SECRET})")
    if store.get(ns, ADMIN_SECRET) is None:
        store.put(
            ns, ADMIN_SECRET, {**_client_material(ca, work, "t5-admin"), PASSWORD: secrets.token_urlsafe(32).encode()}
        )
        say(f"made root's password and the administrative certificate (Secret {ns}/{ADMIN_SECRET})")
    if store.get(training_ns, CLIENT_SECRET) is None:
        store.put(training_ns, CLIENT_SECRET, _client_material(ca, work, "t5-agents"))
        say(f"made the agents' client certificate (Secret {training_ns}/{CLIENT_SECRET})")


def expires_within(cert_pem: bytes, days: int) -> bool:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    return left < datetime.timedelta(days=days)


def renew(
    store: SecretStore, ns: str, training_ns: str, hosts: list[str], work: str, within_days: int = RENEW_WITHIN_DAYS
) -> list[str]:
    """Re-issue the certificates that expire within ``within_days`` from the stored CA; returns what was renewed."""
    ca = _ca(store, ns, work)
    if expires_within(_read(ca.paths.cert), within_days):
        say(
            f"WARNING: the CA itself expires within {within_days} days; it is not rotated automatically "
            f"(docs/kubernetes.md, 'etcd certificates')"
        )
    renewed = []
    member = store.get(ns, MEMBER_SECRET)
    if member and expires_within(member["tls.crt"], within_days):
        cert = ca.issue("etcd-member", work, hosts=hosts)  # the JWT keys stay: tokens in use remain valid
        store.put(ns, MEMBER_SECRET, {**member, "tls.crt": _read(cert.cert), "tls.key": _read(cert.key)}, replace=True)
        renewed.append(f"{ns}/{MEMBER_SECRET}")
    for where, name, who in ((ns, ADMIN_SECRET, "t5-admin"), (training_ns, CLIENT_SECRET, "t5-agents")):
        current = store.get(where, name)
        if current and expires_within(current[CLIENT_CERT], within_days):
            store.put(where, name, {**current, **_client_material(ca, work, who)}, replace=True)
            renewed.append(f"{where}/{name}")
    say(f"renewed: {', '.join(renewed) or 'nothing (every certificate is valid for more than {within_days} days)'}")
    return renewed


# ------------------------------------------------------------------------------------------- etcd
def root_credentials(store: SecretStore, ns: str, endpoints: list[str], work: str):
    from training.launch.rendezvous.admin import JOBS_PREFIX
    from training.launch.rendezvous.client import ClientCredentials

    admin = store.get(ns, ADMIN_SECRET)
    if admin is None:
        raise RuntimeError(f"Secret {ns}/{ADMIN_SECRET} is missing: run the etcd-bootstrap Job first")
    return ClientCredentials(
        tuple(endpoints),
        _write(work, "admin-ca.crt", admin[CA_CERT]),
        _write(work, "admin.crt", admin[CLIENT_CERT]),
        _write(work, "admin.key", admin[CLIENT_KEY]),
        "root",
        _write(work, "root.password", admin[PASSWORD]),
        JOBS_PREFIX,
    )


def enable_auth_once(creds, timeout_s: float = 600.0) -> str:
    """Turn authentication on unless it is on already (then only check root's password); waits for the members.
    Returns what it did."""
    from training.launch.rendezvous.admin import EtcdAdmin
    from training.launch.rendezvous.client import EtcdClient, StoreRefused, StoreUnavailable, b64

    client = EtcdClient(creds, request_timeout_s=5.0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            try:
                client.post("kv/range", {"key": b64(creds.prefix)}, authenticated=False)
            except StoreRefused:  # auth is on: a request without a token is refused
                client.post("kv/range", {"key": b64(creds.prefix)})  # root's stored password works
                return "authentication was on already; root's password checked"
            EtcdAdmin(creds).enable_auth()
            return "authentication turned on (user root)"
        except StoreUnavailable as e:
            if time.monotonic() > deadline:
                raise
            say(f"waiting for the members: {str(e)[:200]}")
            time.sleep(5)


def add_job(store: SecretStore, creds, job: str, training_ns: str, work: str) -> str:
    """The TrainJob's etcd user and role on a clean prefix; its password in Secret ``<job>-etcd``."""
    from training.launch.rendezvous.admin import EtcdAdmin
    from training.launch.rendezvous.client import EtcdClient, b64, prefix_end

    admin = EtcdAdmin(creds)
    prefix = f"{creds.prefix}{job}/"
    # an earlier TrainJob of this name left its rounds (a closed rendezvous) behind: start clean
    EtcdClient(creds).post("kv/deleterange", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
    job_creds = admin.add_job_user(job, work, rotate=True)  # a new TrainJob of the name: its prefix was just wiped
    store.put(training_ns, job_secret_name(job), {PASSWORD: _read(job_creds.password_file)}, replace=True)
    return (
        f"etcd user {job_creds.user}: read/write {job_creds.prefix}; password in Secret "
        f"{training_ns}/{job_secret_name(job)}"
    )


def main(argv: list[str] | None = None, store: SecretStore | None = None) -> int:
    p = argparse.ArgumentParser(prog="etcd_admin_job.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("bootstrap")
    sub.add_parser("renew")
    add = sub.add_parser("add-job")
    add.add_argument("--job", required=True)
    a = p.parse_args(argv)
    env = os.environ
    ns, training_ns = env.get("T5_ETCD_NAMESPACE", "t5-etcd"), env.get("T5_TRAINING_NAMESPACE", "training")
    endpoints = [e for e in env.get("T5_ETCD_ENDPOINTS", "").split(",") if e]
    hosts = [h for h in env.get("T5_ETCD_CERT_HOSTS", "").split(",") if h]
    if not endpoints or not hosts:
        print("error: T5_ETCD_ENDPOINTS and T5_ETCD_CERT_HOSTS must be set (the Job sets them)", file=sys.stderr)
        return 2
    store = store or SecretStore()
    with tempfile.TemporaryDirectory(prefix="etcd-admin-") as work:
        try:
            if a.command == "bootstrap":
                ensure_material(store, ns, training_ns, hosts, work)
                say(enable_auth_once(root_credentials(store, ns, endpoints, work)))
            elif a.command == "renew":
                renew(store, ns, training_ns, hosts, work)
            else:
                say(add_job(store, root_credentials(store, ns, endpoints, work), a.job, training_ns, work))
        except Exception as e:  # noqa: BLE001 - one line in the Job's log; the Job retries
            print(f"error: {a.command}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
