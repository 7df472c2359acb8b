"""An agent's start on etcd (training/launch/rendezvous/start.py): wrong settings, another job's rendezvous id and
a finished job's are one line and exit 2 from the real agent (``python -m training.launch.agent``), against a real
3-member etcd with TLS and auth; ``admin add-job`` does not replace a job's password by accident.

Timings are bounds, not measurements: the window under test is short (2 s), each agent start imports torch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT, TINY
from training.launch.rendezvous.client import ClientCredentials, EtcdClient, StoreRefused
from training.launch.rendezvous.handler import EtcdRendezvousHandler
from training.launch.rendezvous.members import LocalEtcd
from training.launch.rendezvous.start import StartRefused, check_start, first_contact

WINDOW_S = 2


def _session_processes(sid: int) -> list[str]:
    """The processes still alive in session ``sid`` (the agent's, started in a session of its own)."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(f"{pid} {cmd[:120]}")
    return left


def run_agent(env: dict[str, str], run_id: str, out_dir, conf: str = "") -> tuple[int, list[str], float]:
    """The real agent of a 1-node training job (warm workers on: the forkserver is what could be left behind);
    returns its exit code, its stderr lines, and the seconds it took. Fails if a process of it outlives it."""
    argv = [
        sys.executable,
        "-m",
        "training.launch.agent",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=t5-etcd",
        "--rdzv-endpoint=127.0.0.1:2379",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout=60,first_contact_timeout={WINDOW_S}{conf}",
        "--module",
        "training",
        *TINY,
        "--train.steps",
        "4",
        "--job.out_dir",
        str(out_dir),
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("T5_ETCD_", "T5_JOB_"))}
    start = time.monotonic()
    p = subprocess.Popen(
        argv,
        env={**clean, "OMP_NUM_THREADS": "1", **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    took = time.monotonic() - start
    time.sleep(0.5)  # a child that outlived the agent would still be there now
    left = _session_processes(p.pid)
    assert not left, f"left behind: {left}"
    return p.returncode, [line for line in err.splitlines() if line.strip()], took


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(code: int, lines: list[str]) -> str:
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in lines[0], lines
    return lines[0]


# ------------------------------------------------------------------ settings: one line, exit 2, nothing left
SETTINGS = {
    # case: (how the job's settings are spoiled, what the one line must say)
    "refused": (
        lambda c, cl: {"T5_ETCD_ENDPOINTS": f"https://127.0.0.1:{_free_port()}"},
        ["T5_ETCD_ENDPOINTS=https://127.0.0.1:", "connection refused", "list the etcd members' client URLs"],
    ),
    "system CA": (
        lambda c, cl: {"T5_ETCD_CA": _system_ca()},
        ["T5_ETCD_CA=", "certificate verify failed", "point T5_ETCD_CA at the etcd cluster's CA"],
    ),
    "no scheme": (
        lambda c, cl: {"T5_ETCD_ENDPOINTS": ",".join(e.split("//")[1] for e in c.endpoints)},
        ["T5_ETCD_ENDPOINTS=", "is not an https:// URL", "write each endpoint as https://HOST:PORT"],
    ),
    "not etcd": (
        lambda c, cl: {"T5_ETCD_ENDPOINTS": cl.members[0].peer_url},  # a TLS server of the same CA
        ["T5_ETCD_ENDPOINTS=", "the server is not etcd", "HTTP 404"],
    ),
    "wrong password": (
        lambda c, cl: {"T5_ETCD_PASSWORD_FILE": _file(cl, "wrong.password", "not-it")},
        ["T5_ETCD_PASSWORD_FILE=", "etcd refused the login", "job.env that admin add-job wrote"],
    ),
    "variable missing": (lambda c, cl: {"T5_ETCD_CA": ""}, ["etcd credentials incomplete: T5_ETCD_CA not set"]),
    "key file missing": (
        lambda c, cl: {"T5_ETCD_KEY": "/nonexistent/client.key"},
        ["T5_ETCD_KEY=/nonexistent/client.key: the file does not exist", "point T5_ETCD_KEY at"],
    ),
}


def _system_ca() -> str:
    import ssl

    return ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"


def _file(cluster: LocalEtcd, name: str, text: str) -> str:
    path = os.path.join(cluster.workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("case", list(SETTINGS))
def test_a_wrong_setting_is_one_line_naming_it_and_exit_2(etcd, tmp_path, case):
    """Each of these waited the whole join timeout as an outage ('no etcd member answered', once a second) or
    ended in a 36-48-line traceback through torchrun, leaving the warm workers' forkserver behind."""
    creds = etcd.add_job_user(f"settings-{len(case)}-{case.split()[0]}")
    spoil, needles = SETTINGS[case]
    code, lines, took = run_agent({**creds.as_env(), **spoil(creds, etcd)}, "settings", tmp_path / "out")
    line = _one_line(code, lines)
    assert all(n in line for n in needles), line
    assert took < 120, took  # the window (2 s) plus the agent's start, not the join timeout (60 s)


# ------------------------------------------------------------------ an outage at the start is still waited for
def test_members_that_take_the_connection_but_do_not_answer_are_waited_for_not_called_a_setting(etcd):
    """Stopped members (sockets open, no answer) at an agent's very start: an outage, waited for past the
    first-contact window; the start goes on once they answer."""
    creds = etcd.add_job_user("paused-at-start")
    client = EtcdClient(creds)
    result: dict = {}

    def start() -> None:
        try:
            result["value"] = first_contact(
                lambda: client.get(client.key("x")), creds, window_s=1.0, join_timeout_s=120
            )
        except StartRefused as e:
            result["refused"] = str(e)

    etcd.pause()
    try:
        thread = threading.Thread(target=start)
        thread.start()
        time.sleep(6)  # several windows
        assert thread.is_alive(), result
    finally:
        etcd.resume()
    thread.join(60)
    assert not thread.is_alive() and result == {"value": None}, result
    client.close()


# ------------------------------------------------------------------ identity: one job per rendezvous id
def test_an_agent_of_another_job_under_a_running_jobs_id_is_refused_naming_both(etcd, tmp_path):
    creds = etcd.add_job_user("shared-id")
    check_start("shared-id", f"out_dir {tmp_path / 'first'}", {}, env=creds.as_env())  # the running job's node
    check_start("shared-id", f"out_dir {tmp_path / 'first'}", {}, env=creds.as_env())  # its spare / restart
    code, lines, _ = run_agent(creds.as_env(), "shared-id", tmp_path / "second")
    line = _one_line(code, lines)
    assert f"rendezvous id 'shared-id' belongs to another job (out_dir {tmp_path / 'first'}" in line, line
    assert f"this node's job is out_dir {tmp_path / 'second'}" in line and "give this run its own" in line, line


def test_an_agent_of_the_same_job_passes_and_a_given_identity_wins(etcd, tmp_path):
    creds = etcd.add_job_user("same-job")
    check_start("same-job", "job 7", {}, env=creds.as_env())
    check_start("same-job", "job 7", {}, env=creds.as_env())  # a spare or a restarted node of job 7
    with pytest.raises(StartRefused, match="belongs to another job \\(job 7"):
        check_start("same-job", "job 8", {}, env=creds.as_env())
    stored = EtcdClient(creds).get(creds.prefix + "rdzv/same-job/job")
    assert '"identity": "job 7"' in stored.value  # written once, by the first


def test_an_agent_that_arrives_at_a_finished_jobs_rendezvous_is_refused_not_a_silent_spare(etcd, tmp_path):
    """It waited as a hot spare and exited 0 'not needed', having trained nothing."""
    creds = etcd.add_job_user("finished")
    node = EtcdRendezvousHandler(
        "finished", EtcdClient(creds), min_nodes=1, max_nodes=1, ttl_s=2, last_call_s=0.5, join_timeout_s=30
    )
    node.next_rendezvous()
    assert node.shutdown() is True  # the job ended: its rendezvous closed
    code, lines, _ = run_agent(creds.as_env(), "finished", tmp_path / "out")
    line = _one_line(code, lines)
    assert "rendezvous id 'finished' belongs to a job that ended at 20" in line, line
    assert "give this run a new rendezvous id" in line, line


def test_a_late_node_of_the_job_that_ended_exits_0_saying_it_is_not_needed(etcd, tmp_path):
    """The same job (its identity recorded at its start) ended; a node of it that starts only now (a replacement
    pod that came as the job finished) is not an error: a pod that failed would fail a TrainJob that succeeded."""
    creds = etcd.add_job_user("ended-own")
    out = tmp_path / "out"
    check_start("ended-own", f"out_dir {out}", {}, env=creds.as_env())  # the job's first node, at its start
    node = EtcdRendezvousHandler(
        "ended-own", EtcdClient(creds), min_nodes=1, max_nodes=1, ttl_s=2, last_call_s=0.5, join_timeout_s=30
    )
    node.next_rendezvous()
    assert node.shutdown() is True
    code, lines, _ = run_agent(creds.as_env(), "ended-own", out)
    assert code == 0 and len(lines) == 1, lines
    assert lines[0].startswith("[agent] the job of rendezvous id 'ended-own' (out_dir ") and "not needed" in lines[0]


def test_a_bad_first_contact_timeout_is_named(etcd, tmp_path):
    creds = etcd.add_job_user("bad-window")
    with pytest.raises(StartRefused, match="--rdzv-conf first_contact_timeout='soon' is not a positive number"):
        check_start("bad-window", "x", {"first_contact_timeout": "soon"}, env=creds.as_env())
    with pytest.raises(StartRefused, match="T5_ETCD_FIRST_CONTACT_S='0' is not a positive number"):
        check_start("bad-window", "x", {}, env={**creds.as_env(), "T5_ETCD_FIRST_CONTACT_S": "0"})


# ------------------------------------------------------------------ admin add-job
def test_add_job_for_an_existing_job_is_refused_unless_rotate(etcd, tmp_path):
    root = etcd.root_credentials()
    env = {**os.environ, **root.as_env(), "T5_ETCD_ROOT_PASSWORD_FILE": root.password_file}

    def add_job(out: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "training.launch.rendezvous.admin",
                "add-job",
                "--job",
                "busy",
                "--out",
                str(tmp_path / out),
                *extra,
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert add_job("first").returncode == 0
    running = ClientCredentials.from_env(
        dict(line.split("=", 1) for line in (tmp_path / "first" / "job.env").read_text().splitlines())
    )
    r = add_job("again")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: job 'busy' has an etcd user already (job-busy); a new password would lock its running agents out: "
        "give a new job id, or pass --rotate to replace its password on purpose"
    ), r.stderr
    assert not (tmp_path / "again").exists()
    EtcdClient(running).put(running.prefix + "k", "v")  # the running job's password still works
    assert add_job("rotated", "--rotate").returncode == 0
    with pytest.raises(StoreRefused, match="could not log in"):
        EtcdClient(running).put(running.prefix + "k", "v")
    assert (
        "--rotate"
        in subprocess.run(
            [sys.executable, "-m", "training.launch.rendezvous.admin", "add-job", "-h"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
