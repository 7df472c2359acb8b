"""The batch script's membership section against a real 3-member etcd: which T5_ETCD_* its agents get.

Root's credentials (rendered ``etcd_env`` or the submit environment) make the job's own etcd user once per job
(a requeue reuses it) and the agents never see root's password; a job's job.env is used as given; a half-given
configuration or an unreadable file is one line and exit 2; without T5_ETCD_* the c10d store path is kept.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path


from cluster_assets.slurm.config import SlurmJobConfig
from cluster_assets.slurm.render import render
from training.launch.rendezvous.client import ClientCredentials, EtcdClient
from training.launch.rendezvous.members import LocalEtcd

ROOT = Path(__file__).resolve().parents[3]
PYTHON = str(ROOT / ".venv" / "bin" / "python")
BEGIN, END = (
    "# ---------------------------------------------------------------- membership: etcd",
    "# ---------------------------------------------------------------- c10d rendezvous store",
)


def root_env(etcd: LocalEtcd) -> dict[str, str]:
    creds = etcd.root_credentials()
    return {
        "T5_ETCD_ENDPOINTS": ",".join(creds.endpoints),
        "T5_ETCD_CA": creds.ca,
        "T5_ETCD_CERT": creds.cert,
        "T5_ETCD_KEY": creds.key,
        "T5_ETCD_ROOT_PASSWORD_FILE": creds.password_file,
    }


def write_env(path: Path, env: dict[str, str]) -> str:
    path.write_text("".join(f"export {k}={v}\n" for k, v in env.items()))
    return str(path)


def membership(tmp_path: Path, env: dict[str, str], etcd_env: str | None = None, job: int = 77):
    """Run the rendered script's membership section as the batch host would (venv mode); returns the exit code,
    its output and the T5_ETCD_* it leaves for the agents."""
    text = render(
        SlurmJobConfig(shared_dir=str(tmp_path), run_name="r", etcd_env=etcd_env, python=PYTHON, repo_dir=str(ROOT))
    )
    setting = re.search(r"^ETCD_ENV=.*$", text, flags=re.M).group(0)
    section = text[text.index(BEGIN) : text.index(END)]
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "membership.sh"
    script.write_text(
        f'set -uo pipefail\nsay() {{ echo "[t5-slurm] $*"; }}\nSRUN_RUNTIME=()\nPY={PYTHON}\n'
        f'RUN_DIR={run_dir}\nJOB={job}\n{setting}\n{section}\necho "ETCD=$ETCD"\n'
        'env | grep "^T5_ETCD_" | sort || true\n'
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("T5_ETCD_")}
    out = subprocess.run(
        ["bash", str(script)], env={**base, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True, timeout=60
    )
    got = dict(line.split("=", 1) for line in out.stdout.splitlines() if line.startswith("T5_ETCD_"))
    return out.returncode, out.stdout + out.stderr, got


def test_root_credentials_make_the_jobs_own_user_once(etcd, tmp_path):
    rc, log, got = membership(tmp_path, root_env(etcd))
    assert rc == 0, log
    assert "ETCD=1" in log
    assert got["T5_ETCD_USER"] == "job-slurm-77" and got["T5_ETCD_PREFIX"] == "/t5-failover/jobs/slurm-77/"
    assert "T5_ETCD_ROOT_PASSWORD_FILE" not in got  # the agents never hold root's password
    assert Path(got["T5_ETCD_PASSWORD_FILE"]).parent == tmp_path / "runs" / "r" / ".etcd-77"
    client = EtcdClient(ClientCredentials.from_env(got))  # the agents' credentials work, under the job's prefix
    client.put(client.key("rdzv/x"), "1")
    assert client.get(client.key("rdzv/x")).value == "1"
    password = Path(got["T5_ETCD_PASSWORD_FILE"]).read_text()
    rc, log, again = membership(tmp_path, root_env(etcd))  # the requeued job: same user, same password
    assert rc == 0 and again == got and Path(got["T5_ETCD_PASSWORD_FILE"]).read_text() == password, log


def test_the_rendered_file_wins_over_the_environment(etcd, tmp_path):
    admin = write_env(tmp_path / "admin.env", root_env(etcd))
    bogus = {"T5_ETCD_ENDPOINTS": "https://192.0.2.1:1", "T5_ETCD_USER": "someone"}
    rc, log, got = membership(tmp_path, bogus, etcd_env=admin, job=78)
    assert rc == 0, log
    assert got["T5_ETCD_ENDPOINTS"] == ",".join(etcd.endpoints) and got["T5_ETCD_USER"] == "job-slurm-78"


def test_a_jobs_env_file_is_used_as_given(etcd, tmp_path):
    creds = etcd.add_job_user("given")
    rc, log, got = membership(tmp_path, {}, etcd_env=write_env(tmp_path / "job.env", creds.as_env()))
    assert rc == 0, log
    assert got == creds.as_env()
    assert not (tmp_path / "runs" / "r" / ".etcd-77").exists()


def test_half_given_or_unreadable_configuration_is_one_line_exit_2(etcd, tmp_path):
    rc, log, _ = membership(tmp_path, {"T5_ETCD_ENDPOINTS": ",".join(etcd.endpoints)})
    assert rc == 2
    (line,) = [x for x in log.splitlines() if "ERROR" in x]
    assert "T5_ETCD_CA T5_ETCD_CERT T5_ETCD_KEY T5_ETCD_USER T5_ETCD_PASSWORD_FILE T5_ETCD_PREFIX not" in line
    rc, log, _ = membership(tmp_path, {}, etcd_env=str(tmp_path / "missing.env"))
    assert rc == 2 and f"etcd_env={tmp_path / 'missing.env'} is not readable" in log


def test_without_etcd_the_c10d_store_path_is_kept(tmp_path):
    rc, log, got = membership(tmp_path, {})
    assert rc == 0 and "ETCD=0" in log and got == {}


def test_with_etcd_the_spare_joins_after_training_started_and_asks_to_be_chosen_last(tmp_path):
    """The batch host's node agent with etcd: no standby.py (torch's pickled c10d state); its agent starts once
    this incarnation's first start record is in the metrics file (an older incarnation's does not count), with
    T5_STANDBY=1."""
    text = render(SlurmJobConfig(shared_dir="/fsx", run_name="r"))
    start = text.index("NODE_AGENT='")
    assign = text[start : text.index('exit "$rc"\'', start) + len('exit "$rc"\'')]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"event": "start", "time": 1}\n')  # the incarnation before this one
    script = tmp_path / "agent.sh"
    script.write_text(assign + '\nexec bash -c "$NODE_AGENT" t5-node-agent "$@"\n')
    env = {
        **os.environ,
        "SLURM_NODEID": "0",
        "T5_STANDBY_NODE": "0",
        "T5_ETCD_ENDPOINTS": "https://192.0.2.1:1",
        "T5_STANDBY_METRICS": str(metrics),
        "T5_STANDBY_METRICS_LINE0": "1",
        "T5_STANDBY_TIMEOUT": "60",
    }
    agent = ["bash", "-c", 'echo "standby=$T5_STANDBY lines=$(wc -l < "$0")"', str(metrics)]
    p = subprocess.Popen(["bash", str(script), *agent], env=env, stdout=subprocess.PIPE, text=True)
    with open(metrics, "a") as f:  # this incarnation trains: the spare's agent may join now
        f.write('{"event": "start", "time": 2}\n')
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and out.strip() == "standby=1 lines=2"
    # no start record of this incarnation: it waits out T5_STANDBY_TIMEOUT, then joins anyway
    env["T5_STANDBY_METRICS_LINE0"], env["T5_STANDBY_TIMEOUT"] = "2", "1"
    t0 = time.monotonic()
    out = subprocess.run(["bash", str(script), *agent], env=env, capture_output=True, text=True, timeout=30).stdout
    assert out.strip() == "standby=1 lines=2" and time.monotonic() - t0 >= 1.0


def test_a_spare_still_standing_by_when_training_finished_leaves(tmp_path):
    """Training finished (this incarnation's end record) while the rendezvous could not be closed (no etcd member
    answered then): the spare's node agent stops its agent and exits 0, saying why."""
    text = render(SlurmJobConfig(shared_dir="/fsx", run_name="r"))
    start = text.index("NODE_AGENT='")
    assign = text[start : text.index('exit "$rc"\'', start) + len('exit "$rc"\'')]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"event": "start", "time": 1}\n')
    script = tmp_path / "agent.sh"
    script.write_text(assign + '\nexec bash -c "$NODE_AGENT" t5-node-agent "$@"\n')
    env = {
        **os.environ,
        "SLURM_NODEID": "0",
        "T5_STANDBY_NODE": "0",
        "T5_ETCD_ENDPOINTS": "https://192.0.2.1:1",
        "T5_STANDBY_METRICS": str(metrics),
        "T5_STANDBY_METRICS_LINE0": "0",
        "T5_STANDBY_TIMEOUT": "60",
        "T5_STANDBY_RELEASE_S": "0",
    }
    # an agent standing by forever (it exits 143 on SIGTERM, as torchrun's does), and says when it stands by
    ready = tmp_path / "standing-by"
    agent = ["bash", "-c", f"trap 'exit 143' TERM; touch {ready}; while :; do sleep 0.1; done"]
    p = subprocess.Popen(["bash", str(script), *agent], env=env, stderr=subprocess.PIPE, text=True)
    while not ready.exists():
        assert p.poll() is None, p.stderr.read()
        time.sleep(0.05)
    with open(metrics, "a") as f:
        f.write('{"event": "end", "time": 4, "step": 12, "status": "finished"}\n')
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "training finished while this hot spare stood by" in err
