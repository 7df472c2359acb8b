"""``python -m chaos.local``: run failure scenarios against simulated nodes and print a pass/fail table.

Computes an uninterrupted reference run once (cached by config + training code under --cache), then runs
each scenario on a fresh checkpoint directory, and writes report.json and timeline.png to --out.
Scenarios (``--scenarios NAME,NAME``; default all):

{listing}

Soak (``--soak 10m``, env SOAK; ``make chaos-test SOAK=10m``): instead of the scenarios, the job runs as long
as an uninterrupted one takes that long, with one seeded random fault per ``--soak-every`` seconds (worker
kill, node kill, silent node, hang) and a hot spare, and reports goodput against the uninterrupted run
(chaos/local/soak.py).

SPARES (the Makefile variable) sets the soak's hot spares (``--soak-spares``); the scenarios choose their own,
so they refuse a non-zero SPARES. Training flags after ``--`` are checked with the training CLI's own parser
before anything runs (the dry run too).

Exit code 0 when every scenario passed, 1 otherwise, 2 for a bad setting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from chaos import catalog
from chaos.local.config import REPO, LocalChaosConfig, LocalChaosConfigError
from tools.env_flags import EnvFlagError, env_count


def build_parser() -> argparse.ArgumentParser:
    d = LocalChaosConfig()
    p = argparse.ArgumentParser(
        prog="python -m chaos.local",
        description=__doc__.format(listing=catalog.listing("local")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenarios", default="all", help="comma-separated scenario names, e.g. worker-kill,preemption (default: all)"
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    try:  # a bad NODES/NPROC/SPARES is one line naming it (python -m chaos.local directly; chaos.sh checks them too)
        nodes, nproc = env_count("NODES", d.nodes, 1), env_count("NPROC", d.nproc_per_node, 1)
        spares = env_count("SPARES", None, 0)
    except EnvFlagError as e:
        p.exit(2, f"error: {e}\n")
    p.add_argument("--nodes", type=int, default=nodes, help="simulated nodes (env NODES; default 2)")
    p.add_argument("--nproc-per-node", type=int, default=nproc, help="workers per node (env NPROC; default 1)")
    p.add_argument("--preset", default=os.environ.get("PRESET") or d.preset, help="training preset (default debug)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"steps per job (default {d.steps})")
    p.add_argument("--global-batch", type=int, default=d.global_batch, help=f"(default {d.global_batch})")
    p.add_argument("--interval", type=int, default=d.interval, help=f"checkpoint interval (default {d.interval})")
    p.add_argument(
        "--memory-interval",
        type=int,
        default=d.memory_interval,
        help=f"in-memory snapshot interval, 0 = off: storage only (default {d.memory_interval})",
    )
    p.add_argument(
        "--train-timeout-s",
        type=int,
        default=d.train_timeout_s,
        help=f"process-group timeout after step 1 (default {d.train_timeout_s})",
    )
    p.add_argument(
        "--heartbeat-timeout-s",
        type=float,
        default=d.heartbeat_timeout_s,
        help=f"a silent peer is declared after this long, 0 = watchdog off (default {d.heartbeat_timeout_s:g})",
    )
    p.add_argument("--max-restarts", type=int, default=d.max_restarts, help=f"(default {d.max_restarts})")
    p.add_argument(
        "--coordinator",
        choices=("etcd", "store"),
        default=d.coordinator,
        help="membership: etcd (3 members on loopback, default) or store (torch's c10d on the "
        "standalone store, as the clusters run it today); the store-* scenarios need etcd",
    )
    p.add_argument(
        "--scenario-timeout-s",
        type=float,
        default=d.scenario_timeout_s,
        help=f"stop a scenario after this long (default {d.scenario_timeout_s:.0f})",
    )
    p.add_argument(
        "--soak",
        default=os.environ.get("SOAK") or "",
        metavar="DURATION",
        help="goodput soak of this length (e.g. 10m; env SOAK) instead of the scenarios",
    )
    p.add_argument("--soak-every", type=float, default=60.0, help="soak: one fault per this many seconds (default 60)")
    p.add_argument("--soak-seed", type=int, default=0, help="soak: seed of the fault schedule (default 0)")
    p.add_argument(
        "--soak-spares",
        type=int,
        default=1 if spares is None else spares,
        help="soak: hot-spare nodes (env SPARES; default 1)",
    )
    p.set_defaults(env_spares=spares)  # run() refuses a non-zero SPARES for the scenarios, which pick their own
    p.add_argument("--out", type=Path, help="run directory (default .chaos/runs/<time>)")
    p.add_argument("--cache", type=Path, default=REPO / ".chaos" / "cache", help="reference-run cache")
    p.add_argument(
        "--keep", action="store_true", help="keep the checkpoints, snapshots and etcd data of passing scenarios"
    )
    p.add_argument("--dry-run", action="store_true", help="print the config and one agent's command; run nothing")
    p.add_argument("train_args", nargs="*", help="after --: extra training flags for every run")
    return p


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so every ``finally`` stops what the harness started."""

    signum = signal.SIGTERM


def _raise_stopped(_signum, _frame) -> None:
    raise Stopped()


def _refuse_what_the_store_cannot_run(cfg: LocalChaosConfig, names: list[str], soak: bool) -> None:
    """torch's c10d rendezvous runs no hot spares and has no etcd members to fault: say which of the asked-for
    runs need etcd (before anything starts)."""
    from chaos.local.scenarios import scenarios

    table = scenarios(cfg)
    need = [n for n in names if table[n].spares or n.startswith("store-")] + (["the soak (hot spares)"] if soak else [])
    if need:
        raise LocalChaosConfigError(
            f"--coordinator store cannot run {', '.join(need)} (hot spares and the etcd "
            f"members' faults need etcd): drop --coordinator store, or pick other "
            f"--scenarios"
        )


def _refuse_spares_for_scenarios(cfg: LocalChaosConfig, spares: int | None) -> None:
    """SPARES (make chaos-test SPARES=N) means hot spares beyond NODES; each scenario has its own (one where it
    tests a spare's takeover, none elsewhere), so a non-zero SPARES would be ignored: refuse it, naming those."""
    if not spares:
        return
    from chaos.local.scenarios import scenarios

    table = scenarios(cfg)
    with_spare = [n for n in table if table[n].spares]
    raise LocalChaosConfigError(
        f"SPARES={spares}: chaos-test's scenarios choose their own hot spares "
        f"({', '.join(with_spare)} run one); unset SPARES, or use it with SOAK=<duration> "
        f"(the soak's hot spares, --soak-spares)"
    )


def _refuse_bad_training_args(cfg: LocalChaosConfig) -> None:
    """The flags after ``--`` reach every job's workers: check them with the training CLI's own parser now, so
    a misspelt one is one line here, not a failed reference run (or a plan printed as if it would run)."""
    import contextlib
    import io

    from training.config import ConfigError, load_config

    if not cfg.extra_args:
        return
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # its notes are the workers' to print, not the check's
            load_config(cfg.training_args("<run>/<scenario>/job"))
    except ConfigError as e:
        raise LocalChaosConfigError(f"training flags after --: {e}") from None


def _refuse_an_unusable_out(out: Path) -> None:
    """--out must be a directory or become one: a file there (or in its path) would end the run in a
    traceback after the checks, so say which path and the fix before anything starts."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == out else f" ({path} is a file)"
                raise LocalChaosConfigError(
                    f"--out {out}: not a directory{where}: give a directory path (it is "
                    f"created), or drop --out for .chaos/runs/<time>"
                )
            return


def main(argv: list[str] | None = None) -> int:
    """Run the harness; a stop (Ctrl-C, SIGTERM) ends it with one line and 128+signal, its processes stopped."""
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        return run(argv)
    except KeyboardInterrupt as e:
        sig = signal.Signals(getattr(e, "signum", signal.SIGINT))
        print(
            f"\n[chaos] stopped by {sig.name}: the processes it started are stopped (exit {128 + sig})",
            file=sys.stderr,
            flush=True,
        )
        return 128 + sig


def run(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = LocalChaosConfig(
        nodes=a.nodes,
        nproc_per_node=a.nproc_per_node,
        preset=a.preset,
        steps=a.steps,
        global_batch=a.global_batch,
        interval=a.interval,
        train_timeout_s=a.train_timeout_s,
        memory_interval=a.memory_interval,
        heartbeat_timeout_s=a.heartbeat_timeout_s,
        max_restarts=a.max_restarts,
        scenario_timeout_s=a.scenario_timeout_s,
        coordinator=a.coordinator,
        extra_args=tuple(a.train_args),
    )
    try:
        cfg.validate()
        names = catalog.select("local", a.scenarios)
        if cfg.coordinator == "store":
            _refuse_what_the_store_cannot_run(cfg, names, bool(a.soak))
        if not a.soak:
            _refuse_spares_for_scenarios(cfg, a.env_spares)
        _refuse_bad_training_args(cfg)
        if a.out and not (a.dry_run or a.list):  # only a run writes there
            _refuse_an_unusable_out(a.out)
    except (LocalChaosConfigError, catalog.UnknownScenario) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.list:
        print(catalog.listing("local"))
        return 0
    if a.soak:
        return soak_main(cfg, a)  # DRY_RUN too: it prints the soak's plan
    if a.dry_run:
        from training.launch import RDZV_ENV, LaunchConfig, format_argv, torchrun_argv

        launch = LaunchConfig(
            min_nodes=cfg.nodes,
            max_nodes=cfg.nodes,
            nproc_per_node=cfg.nproc_per_node,
            coordinator=cfg.coordinator,
            rdzv_id="chaos-<scenario>",
            rdzv_endpoint="127.0.0.1:<store port>",
            max_restarts=cfg.max_restarts,
            train_timeout_s=cfg.train_timeout_s,
            train_args=tuple(cfg.training_args("<run>/<scenario>/job")),
        )
        print(f"config: {cfg}\nscenarios: {', '.join(names)}\nreference key: {cfg.reference_key()}")
        print("agent command (per node; node-loss-rejoin uses --nnodes=1:N):")
        print(format_argv(torchrun_argv(replace(launch, rdzv_endpoint="127.0.0.1:29400")), RDZV_ENV))
        return 0
    from chaos import report
    from chaos.local.scenarios import reference, run_scenario, scenarios

    table = scenarios(cfg)
    out = a.out or REPO / ".chaos" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"[chaos] {len(names)} scenario(s) on {cfg.nodes} simulated node(s) x {cfg.nproc_per_node} proc, "
        f"preset {cfg.preset}, {cfg.steps} steps, checkpoint every {cfg.interval}, memory snapshot "
        f"{f'every {cfg.memory_interval}' if cfg.memory_interval else 'off'}; output {out}",
        flush=True,
    )
    t_all = time.time()
    refs = {}
    results = []
    for name in names:
        sc = table[name]
        job = (sc.math, sc.config(cfg).nodes)
        if job not in refs:
            refs[job] = reference(sc.config(cfg), a.cache, out, sc.math)
        r = run_scenario(cfg, sc, refs[job], out, keep=a.keep)
        results.append(r)
        print(f"[chaos] {name}: {'PASS' if r.passed else 'FAIL'} ({r.wall_s:.0f} s)", flush=True)
    rows = report.targets(cfg.memory_interval or cfg.interval, {r.name: r for r in results})
    png = report.timeline_png(
        out / "timeline.png",
        results,
        f"chaos test: {cfg.nodes} nodes x {cfg.nproc_per_node} proc, {cfg.preset}, "
        f"{cfg.steps} steps, checkpoint every {cfg.interval}",
    ).path
    ref = refs.get(((), cfg.nodes), next(iter(refs.values())))
    ref_gp = report.reference_goodput(ref.effective, ref.wall_s)
    report.write_json(
        out / "report.json",
        "local",
        asdict(cfg),
        results,
        {
            "key": cfg.reference_key(),
            "cached": ref.cached,
            "checkpoint": str(ref.final),
            "wall_s": ref.wall_s,
            "goodput": ref_gp,
        },
        rows,
        png,
    )
    print()
    print(report.table(results, ref_gp))
    print(report.breakdown_table(results))
    print(report.targets_table(rows))
    print(f"report: {out / 'report.json'}\ntimeline: {png}\ntotal {time.time() - t_all:.0f} s")
    last = REPO / ".chaos" / "last"
    if last.is_symlink() or last.exists():
        last.unlink()
    try:
        last.symlink_to(out.resolve())
    except OSError:
        pass
    return 0 if all(r.passed for r in results) else 1


def soak_main(cfg: LocalChaosConfig, a: argparse.Namespace) -> int:
    """``--soak``: run it, print the fault table and goodput, write report.json and timeline.png."""
    from chaos import report
    from chaos.local.soak import (
        GOODPUT_TARGET,
        SoakConfig,
        SoakConfigError,
        fault_table,
        parse_duration,
        run_soak,
        soak_plan,
    )

    try:
        soak = SoakConfig(
            duration_s=parse_duration(a.soak), every_s=a.soak_every, seed=a.soak_seed, spares=a.soak_spares
        )
        soak.validate()
    except SoakConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(soak_plan(cfg, soak))
        return 0
    out = a.out or REPO / ".chaos" / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"[soak] {a.soak} on {cfg.nodes} simulated node(s) + {soak.spares} spare, preset {cfg.preset}; output {out}",
        flush=True,
    )
    res, ref = run_soak(cfg, soak, a.cache, out)
    ref_gp = report.reference_goodput(ref.effective, ref.wall_s)
    png = report.timeline_png(out / "timeline.png", [res], res.title).path
    ratio = res.goodput / ref_gp if ref_gp else 0.0
    row = {
        "target": "soak goodput / uninterrupted goodput",
        "value": round(ratio, 3),
        "values": [ratio],
        "limit": f">= {GOODPUT_TARGET}",
        "met": ratio >= GOODPUT_TARGET,
    }
    report.write_json(
        out / "report.json",
        "local-soak",
        {**asdict(cfg), "soak": asdict(soak)},
        [res],
        {"wall_s": ref.wall_s, "goodput": ref_gp, "checkpoint": str(ref.final)},
        [row],
        png,
    )
    print()
    print(fault_table(res))
    print()
    print(report.table([res], ref_gp))
    for c in res.checks:
        if not c.ok:
            print(f"  FAILED {c.name}: {c.detail}")
    print(
        f"goodput: soak {res.goodput:.1%} ({res.useful_s:.0f} s useful / {res.wall_s:.0f} s wall), uninterrupted "
        f"{ref_gp:.1%} ({ref.wall_s:.0f} s wall): {ratio:.1%} of uninterrupted (target >= {GOODPUT_TARGET:.0%}: "
        f"{'met' if row['met'] else 'not met'}); the same steps took {res.wall_s / ref.wall_s:.2f}x the "
        f"uninterrupted wall time"
    )
    print(f"report: {out / 'report.json'}\ntimeline: {png}")
    return 0 if res.passed else 1


if __name__ == "__main__":
    sys.exit(main())
