"""What an agent checks before it joins a job's rendezvous on etcd (:func:`check_start`, called by
:mod:`training.launch.agent` before it starts anything else): that its settings reach this job's store, and that
the rendezvous id is this job's. Each failure is one line naming the setting and the fix (:class:`StartRefused`).

* Settings, not an outage. Until the store has answered this agent once, a member that cannot be reached is a
  setting to fix far more often than an outage: a refused connection, a certificate the CA does not verify, a
  server that is not etcd. Those are given a short window (:data:`FIRST_CONTACT_S`, ``--rdzv-conf
  first_contact_timeout=S`` or ``T5_ETCD_FIRST_CONTACT_S``), then the start ends naming the variable
  (``T5_ETCD_ENDPOINTS``, ``T5_ETCD_CA``, ...), what was seen and the fix, instead of the handler's outage wait
  (``join_timeout``, 600 s on Slurm) of "no etcd member answered". Members that answer as etcd but cannot serve
  yet (no leader) are an outage: waited for up to the join timeout. Once the store has answered, the handler
  treats an outage as one: it keeps trying and training goes on (:mod:`.handler`).
* ...unless the store answered this job before. Every agent whose first contact succeeded notes it in the job's
  output directory (:data:`ANSWERED_FILE`: the run id, the endpoints, when), which the job's nodes share. An agent
  that starts later (a hot spare, a restarted node, a requeued Slurm step) and finds that note for its own run id
  and endpoints takes members that refuse or do not take the connection for what they are then, an outage (the
  same settings reached the store before), and waits up to the join timeout with one line saying so. Before, such
  a spare ended with exit 2 after the window, and on Slurm its ``srun`` step ending requeued the whole job. A
  certificate or protocol failure is still a setting: the note does not vouch for those files.
* Credentials: a missing ``T5_ETCD_*`` variable or file, a wrong password, another job's prefix: one line.
* Identity. A rendezvous id names one job. Its first agent records the job's identity (``T5_JOB_IDENTITY``, by
  default what the agent derives: the training's absolute ``--job.out_dir``) under the id's prefix (``job``,
  written once: a create-if-absent transaction); an agent of a job with another identity is refused, naming
  both, where it would otherwise wait silently as the other job's hot spare and exit 0. An agent of another job
  that finds the id's rendezvous closed (its job ended) is refused too: nothing would train there. One of the
  same job (a replacement that started as the job ended) exits 0 saying it is not needed, as a spare the job
  finished without does: on Kubernetes a late pod that failed would fail a TrainJob that succeeded. Spares and
  restarted nodes of the same job (the same identity, the rendezvous open) join as before.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Callable, TypeVar

from torch.distributed.elastic.rendezvous.api import RendezvousError

from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused, StoreUnavailable

#: Seconds an agent that has never reached its store keeps trying before it calls its settings wrong.
FIRST_CONTACT_S = 10.0
#: The ``--rdzv-conf`` key and the environment variable that set it (the key wins).
FIRST_CONTACT_KEY, FIRST_CONTACT_ENV = "first_contact_timeout", "T5_ETCD_FIRST_CONTACT_S"
#: What a job's agents share and no other job does; unset, the agent derives it (:mod:`training.launch.agent`).
IDENTITY_ENV = "T5_JOB_IDENTITY"
#: Where a new id comes from (said in the refusals).
NEW_ID = "the launcher's --rdzv-id or T5_RDZV_ID; torchrun's --rdzv-id"
#: The note, in the job's output directory, that this job's store answered one of its agents (module docstring).
ANSWERED_FILE = ".membership-store-answered.json"
T = TypeVar("T")


class StartRefused(RendezvousError):
    """This agent must not join: one line saying why and the fix; ``code`` is the agent's exit code (2: a
    setting; 1: a store that never became able to serve; 0: its own job ended already, the line is not an
    error)."""

    def __init__(self, line: str, code: int = 2):
        super().__init__(line)
        self.code = code


def check_start(run_id: str, identity: str, conf: dict[str, str], env=None, job_dir: str | None = None) -> None:
    """Reach the store with the ``T5_ETCD_*`` settings and check that ``run_id`` is this job's (see the module
    docstring); raises :class:`StartRefused`. ``conf``: torchrun's ``--rdzv-conf`` as a dict; ``job_dir``: the
    job's output directory, shared by its nodes (where the store's answer is noted; None: nowhere)."""
    env = os.environ if env is None else env
    window = first_contact_s(conf, env)
    try:
        creds = ClientCredentials.from_env(env)
        client = EtcdClient(creds)
    except ValueError as e:
        raise StartRefused(str(e)) from None
    try:
        first_contact(
            lambda: check_identity(client, run_id, identity),
            creds,
            window,
            join_timeout_s=float(conf.get("join_timeout", 600)),
            answered_before=answered_before(job_dir, run_id, creds),
        )
    finally:
        client.close()
    note_answered(job_dir, run_id, creds)


def _answer_note(run_id: str, creds: ClientCredentials) -> dict:
    return {"run_id": run_id, "endpoints": sorted(creds.endpoints)}


def answered_before(job_dir: str | None, run_id: str, creds: ClientCredentials) -> str:
    """When this job's store answered one of its agents with these settings (the note in ``job_dir``), "" when
    it never did (or nothing says so)."""
    if not job_dir:
        return ""
    try:
        with open(os.path.join(job_dir, ANSWERED_FILE)) as f:
            note = json.load(f)
    except (OSError, ValueError):
        return ""
    same = isinstance(note, dict) and {k: note.get(k) for k in ("run_id", "endpoints")} == _answer_note(run_id, creds)
    return str(note.get("at", "an unrecorded time")) if same else ""


def note_answered(job_dir: str | None, run_id: str, creds: ClientCredentials) -> None:
    """Note in ``job_dir`` that the store answered this job (best effort: a directory this agent cannot write,
    e.g. not created yet, only loses the note)."""
    if not job_dir:
        return
    path = os.path.join(job_dir, ANSWERED_FILE)
    try:
        os.makedirs(job_dir, exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w") as f:
            json.dump({**_answer_note(run_id, creds), "at": _now(), "host": socket.gethostname()}, f)
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        pass


def first_contact_s(conf: dict[str, str], env) -> float:
    """The first-contact window from ``--rdzv-conf`` or the environment; a bad value is a :class:`StartRefused`."""
    name, raw = (
        (f"--rdzv-conf {FIRST_CONTACT_KEY}", conf[FIRST_CONTACT_KEY])
        if FIRST_CONTACT_KEY in conf
        else (FIRST_CONTACT_ENV, env.get(FIRST_CONTACT_ENV, ""))
    )
    if not raw.strip():
        return FIRST_CONTACT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise StartRefused(
            f"{name}={raw!r} is not a positive number of seconds: give how long an agent that has "
            f"never reached etcd keeps trying (default {FIRST_CONTACT_S:g})"
        )
    return value


def first_contact(
    call: Callable[[], T],
    creds: ClientCredentials,
    window_s: float,
    join_timeout_s: float,
    answered_before: str = "",
) -> T:
    """``call()`` (the agent's first calls to the store), tried again while no member answers: for ``window_s``
    while what the endpoints did points at a setting (:func:`unreachable_setting`), up to ``join_timeout_s``
    while members answer as etcd but cannot serve, or do not take the connection when the store answered this
    job before (``answered_before``: when). A refusal ends at once (:func:`refused_setting`)."""
    start, said = time.monotonic(), False
    while True:
        try:
            return call()
        except StoreRefused as e:
            raise StartRefused(refused_setting(e, creds)) from None
        except StoreUnavailable as e:
            waited = time.monotonic() - start
            line = unreachable_setting(e, creds)
            if line is not None and answered_before and _no_connection(e):
                if not said:
                    seen = line.split(": ", 1)[1].rsplit(": ", 1)[0]  # what was seen where, without the fix
                    print(
                        f"[rendezvous] waiting for the membership store (up to the join timeout, "
                        f"{join_timeout_s:g} s): {seen}; these settings reached it for this job at "
                        f"{answered_before}, so this is an outage, not a setting",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                line = None
            if line is not None and waited > window_s:
                raise StartRefused(
                    f"the membership store never answered this agent within {window_s:g} s: {line}"
                ) from None
            if line is None and waited > join_timeout_s:
                raise StartRefused(
                    f"the etcd members never served this agent within the join timeout "
                    f"({join_timeout_s:g} s): {e}: check the etcd cluster",
                    code=1,
                ) from None
            if line is None and not said:  # etcd is there but cannot serve yet: say why the start waits
                print(f"[rendezvous] waiting for the membership store: {e}", file=sys.stderr, flush=True)
                said = True
            time.sleep(1.0)


# What each kind of failure says about the settings: (the variable, what was seen, the fix), by what urllib3 and
# ssl raised. The first that any endpoint shows wins: a certificate problem is the most specific finding.
_CA_FIX = "point T5_ETCD_CA at the etcd cluster's CA certificate (the one in the job.env that admin add-job wrote)"
_ENDPOINTS_FIX = "list the etcd members' client URLs in T5_ETCD_ENDPOINTS (https://HOST:PORT, port 2379 by default)"


def _finding(error: BaseException) -> tuple[str, str, str]:
    from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError, ProtocolError, SSLError

    text = str(error)
    if isinstance(error, SSLError) and "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text:
            return (
                "T5_ETCD_ENDPOINTS",
                "the member's certificate is not for this host name or address",
                "use the host names or addresses the members' certificates were issued for",
            )
        return (
            "T5_ETCD_CA",
            "certificate verify failed (the server's certificate is not signed by this CA: a "
            "wrong CA, or a server that is not one of the cluster's members)",
            _CA_FIX,
        )
    if isinstance(error, SSLError) and any(w in text for w in ("BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_REQ")):
        return (
            "T5_ETCD_CERT",
            "the member refused this client's certificate (not signed by the cluster's CA)",
            "point T5_ETCD_CERT and T5_ETCD_KEY at the client certificate the etcd cluster's CA issued",
        )
    if isinstance(error, NameResolutionError):
        return "T5_ETCD_ENDPOINTS", "host name not found", _ENDPOINTS_FIX
    if isinstance(error, NewConnectionError):  # urllib3 2 derives it from ConnectTimeoutError: test it first
        seen = "connection refused (nothing listens there)" if "refused" in text else f"no connection ({text[-80:]})"
        return "T5_ETCD_ENDPOINTS", seen, _ENDPOINTS_FIX
    if isinstance(error, ConnectTimeoutError):
        return (
            "T5_ETCD_ENDPOINTS",
            "no answer to a connection (timed out: a wrong address, or a firewall)",
            _ENDPOINTS_FIX,
        )
    if isinstance(error, SSLError):
        return "T5_ETCD_ENDPOINTS", f"TLS failed ({text[-120:]}): not an etcd member's client port", _ENDPOINTS_FIX
    if isinstance(error, ProtocolError):
        return (
            "T5_ETCD_ENDPOINTS",
            "the server closed the connection without an answer (not an etcd client port)",
            _ENDPOINTS_FIX,
        )
    return "T5_ETCD_ENDPOINTS", f"no answer ({type(error).__name__})", _ENDPOINTS_FIX


_ORDER = ("T5_ETCD_CA", "T5_ETCD_CERT", "T5_ETCD_ENDPOINTS")


def unreachable_setting(e: StoreUnavailable, creds: ClientCredentials) -> str | None:
    """One line naming the setting that kept every endpoint from answering, what was seen and the fix; None when
    a member answered as etcd (no leader, too slow): an outage, not a setting."""
    if not e.causes or any(isinstance(error, str) or _accepted_but_silent(error) for _, error in e.causes):
        return None
    findings = [(url, *_finding(error)) for url, error in e.causes]
    url, var, seen, fix = min(findings, key=lambda f: _ORDER.index(f[1]))
    value = (
        ",".join(creds.endpoints)
        if var == "T5_ETCD_ENDPOINTS"
        else getattr(creds, next(n for n, v in ClientCredentials.ENV.items() if v == var))
    )
    return f"{var}={value}: {seen} at {url}: {fix}"


def _no_connection(e: StoreUnavailable) -> bool:
    """Whether no endpoint took the connection (refused, timed out, a name not found: members down, or their pods
    gone), as opposed to a certificate or protocol failure, which the same settings would not have got past."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

    return bool(e.causes) and all(isinstance(err, (NewConnectionError, ConnectTimeoutError)) for _, err in e.causes)


def _accepted_but_silent(error: BaseException) -> bool:
    """A server that took the connection and then did not answer in time: a stopped or loaded member (an outage),
    not a setting; a wrong address or another server fails at once."""
    from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError, SSLError

    return isinstance(error, ReadTimeoutError) or (
        isinstance(error, (SSLError, ConnectTimeoutError)) and "read operation timed out" in str(error)
    )


def refused_setting(e: StoreRefused, creds: ClientCredentials) -> str:
    """One line for a store that refused this agent's first calls: which setting, and the fix."""
    text = str(e)
    if "invalid user ID or password" in text:
        return (
            f"T5_ETCD_USER={creds.user} / T5_ETCD_PASSWORD_FILE={creds.password_file}: etcd refused the "
            f"login (wrong user or password): use the job.env that admin add-job wrote for this job (add-job "
            f"--rotate gives the job a new password; its agents then need the new file)"
        )
    if "permission denied" in text:
        return (
            f"T5_ETCD_PREFIX={creds.prefix}: etcd user {creds.user} may not use that prefix (permission "
            f"denied): use the prefix in the job's job.env (/t5-failover/jobs/<job>/)"
        )
    if any(f"HTTP {code}" in text for code in (404, 405)) or "not a JSON" in text:
        return (
            f"T5_ETCD_ENDPOINTS={','.join(creds.endpoints)}: the server is not etcd ({text[-160:].strip()}): "
            f"{_ENDPOINTS_FIX}"
        )
    return (
        f"the membership store refused this agent ({text[-200:]}): check T5_ETCD_USER, T5_ETCD_PASSWORD_FILE "
        f"and T5_ETCD_PREFIX (the job.env that admin add-job wrote)"
    )


def check_identity(client: EtcdClient, run_id: str, identity: str) -> None:
    """Refuse a ``run_id`` whose rendezvous is closed or that another job (another ``identity``) recorded; record
    ``identity`` if no job did yet (see the module docstring)."""
    from training.launch.rendezvous import rounds

    prefix = client.key(f"rdzv/{run_id}/")
    head = client.get(prefix + "head")
    theirs = client.get(prefix + "job")
    if head is not None and rounds.Head.loads(head.value).closed:
        ended = client.get(prefix + "ended")
        when = ended.value if ended else "an unrecorded time"
        if theirs is not None and json.loads(theirs.value).get("identity") == identity:
            # this job's own late node (a replacement pod or node that started as the job ended): not an error,
            # or a pod that came too late would fail a TrainJob that succeeded
            raise StartRefused(
                f"[agent] the job of rendezvous id {run_id!r} ({identity}) ended at {when}: this "
                f"node is not needed (a new run of it needs a new rendezvous id: {NEW_ID})",
                code=0,
            )
        raise StartRefused(
            f"rendezvous id {run_id!r} belongs to a job that ended at "
            f"{when}{_job(theirs)} (its rendezvous is closed: "
            f"nothing would train here): give this run a new rendezvous id ({NEW_ID})"
        )
    if theirs is None:
        record = json.dumps({"identity": identity, "host": socket.gethostname(), "at": _now()})
        if client.compare_and_set(prefix + "job", 0, record):
            return
        theirs = client.get(prefix + "job")  # another agent recorded its job first: the same one, or not
    recorded = json.loads(theirs.value) if theirs else {}
    if recorded.get("identity", identity) != identity:
        raise StartRefused(
            f"rendezvous id {run_id!r} belongs to another job ({recorded['identity']}, recorded by "
            f"{recorded.get('host', '?')} at {recorded.get('at', '?')}); this node's job is "
            f"{identity}: give this run its own rendezvous id ({NEW_ID}), or start it as that job "
            f"(the same --job.out_dir, or {IDENTITY_ENV}) to join it"
        )


def _job(kv) -> str:
    if kv is None:
        return ""
    return f" (job {json.loads(kv.value).get('identity', '?')})"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
