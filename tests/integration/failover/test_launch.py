"""training.launch: LaunchConfig -> torchrun argv, and the local / Slurm / Kubeflow PET mappings."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_facts import platform_timeouts

from training.launch import DEFAULT_RDZV_PORT, config_from_env, config_from_slurm, slurm_first_host

# Helpers this file shares with the other tier's part of the same tests: defined once, in the lighter tier's file.
from tests.unit.failover.test_launch import SLURM

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "kind, env, platform",
    [
        (
            "slurm",
            {
                "SLURM_JOB_NUM_NODES": "2",
                "SLURM_JOB_ID": "5",
                "SLURM_JOB_NODELIST": "n1",
                "SLURM_NODEID": "0",
                "T5_RDZV_ENDPOINT": "10.0.0.1:29400",
            },
            "slurm",
        ),
        (
            "pet",
            {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "j-node-0-0.j", "PET_MASTER_PORT": "29500"},
            "eks",
        ),
        ("local", {}, "local"),
    ],
)
def test_each_mapping_takes_its_platforms_timeouts(kind, env, platform):
    """One table: the launcher on Slurm / EKS / here waits exactly as cluster_facts.TIMEOUTS says."""
    cfg = config_from_env(kind, env)
    t = platform_timeouts(platform)
    assert (
        cfg.shutdown_timeout_s,
        cfg.train_timeout_s,
        cfg.init_timeout_s,
        cfg.checkpoint_timeout_s,
        cfg.tuning.join_timeout,
    ) == (
        t.shutdown_timeout_s,
        t.train_pg_timeout_s,
        t.init_pg_timeout_s,
        t.checkpoint_pg_timeout_s,
        t.rdzv_join_timeout_s,
    )


def test_slurm_mapping_uses_scontrol_expansion(tmp_path, monkeypatch):
    if not shutil.which("scontrol"):
        # The lab's installer (root + apt-get, as CI has) brings the Slurm client; skip only when it cannot.
        inst = subprocess.run([str(ROOT / "testbed/slurm_lab/install.sh")], capture_output=True, text=True)
        if inst.returncode != 0 or not shutil.which("scontrol"):
            pytest.skip(f"Slurm client not installed and the lab installer could not install it: {inst.stderr[-300:]}")
    conf = tmp_path / "slurm.conf"  # scontrol only needs a readable config to expand hostlists
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=gpu[01-12] State=UNKNOWN\nPartitionName=p Nodes=ALL\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm_first_host("gpu[07-09,12]") == "gpu07"
    cfg = config_from_slurm(SLURM)
    assert (cfg.max_nodes, cfg.min_nodes, cfg.nproc_per_node, cfg.node_rank) == (4, 1, 8, 2)
    assert cfg.rdzv_endpoint == f"gpu07:{DEFAULT_RDZV_PORT}" and not cfg.external_store
    assert cfg.rdzv_id == "slurm-4242"


def test_cli_print_and_errors():
    run = [sys.executable, "-m", "training.launch"]
    out = subprocess.run(
        run + ["--print", "--nodes", "3", "--", "--preset", "debug", "--train.global_batch", "12"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    agents = [line for line in out.stdout.splitlines() if "training.launch.agent" in line]
    assert len(agents) == 3 and "3 etcd members" in out.stdout
    assert all("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in a and "--rdzv-backend=t5-etcd" in a for a in agents)
    out = subprocess.run(
        run + ["--print", "--nodes", "2", "--", "--preset", "debug"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "T5_COORDINATOR": "store"},
    )
    assert "training.rdzv_store" in out.stdout and "--rdzv-backend=c10d" in out.stdout
    out = subprocess.run(
        run + ["--print", "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "T5_COORDINATOR": "zookeeper"},
    )
    assert out.returncode == 2 and "coordinator 'zookeeper': use one of etcd, store" in out.stderr
    out = subprocess.run(
        run + ["--from-env", "pet", "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2 and "PET_NNODES is not set" in out.stderr
    out = subprocess.run(run + ["--print", "--preset", "debug"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "after '--'" in out.stderr
    assert subprocess.run(run + ["--help"], capture_output=True, timeout=60, cwd=ROOT).returncode == 0


@pytest.mark.parametrize(
    "args, env, line",
    [
        # a zero keep-alive never heartbeats (or never gives up): torch waited ~125 s, then RendezvousTimeoutError
        (["--keep-alive", "0x0"], {}, "error: --keep-alive 0x0: the interval (s) and the attempts must both be >= 1"),
        (["--keep-alive", "1x0"], {}, "error: --keep-alive 1x0: the interval (s) and the attempts must both be >= 1"),
        ([], {"NODES": "abc"}, "error: NODES='abc' is not an integer: set it to the number of simulated nodes"),
        ([], {"NODES": "0"}, "error: NODES=0 is not a number of nodes"),
        ([], {"NPROC": "abc"}, "error: NPROC='abc' is not a number of workers per node"),
        (["--nodes", "0"], {}, "error: --nodes 0: use 1 or more nodes"),
        (["--nodes", "8001"], {}, "error: max nodes 8001: a round on etcd holds at most 8,000 nodes"),
    ],
)
def test_cli_bad_values_are_one_line_before_anything_starts(args, env, line):
    """Each bad value ends the launcher at parse time with exit 2 and one line naming it (no traceback)."""
    out = subprocess.run(
        [sys.executable, "-m", "training.launch", "--print", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr.startswith(line) and out.stderr.count("\n") == 1, out.stderr
    assert "use e.g. --keep-alive 1x2" in out.stderr or "--keep-alive" not in args


def test_package_reexports_resolve_without_importing_torch():
    """Callers import from the package; it runs before torch is needed, so importing it must not load torch."""
    code = (
        "import sys, training.launch as launch; [getattr(launch, n) for n in launch.__all__]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_missing_etcd_binary_is_one_line_naming_the_fix(tmp_path):
    env = {**os.environ, "T5_ETCD_BIN": str(tmp_path / "no-etcd")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            "2",
            "--",
            "--preset",
            "debug",
            "--job.out_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: T5_ETCD_BIN={str(tmp_path / 'no-etcd')!r} is not an "
        f"executable file: point it at an etcd >= 3.4 binary or unset it"
    )
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


HELP = " (python -m training.launch --help lists the options)"


@pytest.mark.parametrize(
    "args, line",
    [
        # round 4, case 3: argparse printed its 13-line usage before the one useful line
        (["--nodes", "abc"], "error: argument --nodes: 'abc' is not a whole number: pass one, e.g. --nodes 2" + HELP),
        (
            ["--join-timeout", "1.5"],
            "error: argument --join-timeout: '1.5' is not a whole number: pass one, e.g. --join-timeout 120" + HELP,
        ),
        (
            ["--from-env", "k8s"],
            "error: argument --from-env: invalid choice: 'k8s' (choose from 'local', 'slurm', 'pet')" + HELP,
        ),
        (["--nodes"], "error: argument --nodes: expected one argument" + HELP),
        (
            ["--preset", "debug"],
            "error: unknown launcher option(s) --preset: training arguments go after '--' "
            "(python -m training.launch [options] -- --preset debug ...)",
        ),
    ],
    ids=["nodes-abc", "join-timeout-float", "from-env-choice", "nodes-no-value", "training-args-without-dashes"],
)
def test_a_bad_launcher_flag_is_one_line_not_the_usage(args, line):
    out = subprocess.run(
        [sys.executable, "-m", "training.launch", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == line + "\n"


@pytest.mark.parametrize(
    "module, why",
    [("no_such_module", ""), ("no_such_pkg.sub", " (No module named 'no_such_pkg')"), ("training.no_such_module", "")],
)
def test_a_missing_module_is_one_line_before_anything_starts(tmp_path, module, why):
    """Round 4, case 4: torchrun restarted the worker that exited 'No module named ...' three times (31 lines)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--nodes",
            "1",
            "--module",
            module,
            "--",
            "--preset",
            "debug",
            "--job.out_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stdout + out.stderr
    assert out.stderr == (
        f"error: --module {module!r} is not importable here{why}, and the workers run python -m "
        f"{module}; pass an installed module (default training) or set PYTHONPATH so it is found\n"
    )
    assert list(tmp_path.iterdir()) == []
