"""What N agents' lease keep-alives cost a 3-member etcd: through the JSON gateway or over gRPC keep-alive streams.

    python -m tools.keepalive_cost --leases 256,1024 --seconds 20

For each N, a fresh 3-member etcd (TLS, auth on, as the launcher starts it) and N leases, each renewed every
third of the launcher's lease TTL, for ``--seconds``: ``gateway`` (one HTTPS keep-alive call per renewal, the
client's transport before 2026-11-27), ``stream-leader`` and ``stream-follower`` (one kept-open
``Lease/LeaseKeepAlive`` stream per lease, to the leader or to a follower, which forwards each renewal to the
leader). Each lease has its own client and connections, as each agent has. The leases are spread over
``--procs`` client processes (10 nice steps below the members, as a real store has hosts of its own).
The clock starts once every client is connected and has renewed each lease once. Printed per row: renewals a
second done and needed, the members' CPU (all three, percent of one core), the clients' CPU, and how often a
client's lap over its leases took longer than the renewal period (it fell behind).
No rendezvous, no agents: only the one call every agent makes all the time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time

from training.launch.config import ETCD_MIN_LEASE_S
from training.launch.rendezvous.client import ClientCredentials, EtcdClient
from training.launch.rendezvous.lease_stream import LeaseKeepAliveStream
from training.launch.rendezvous.members import LocalEtcd
from tools.rdzv_scale import cpu_s

MODES = ("gateway", "stream-leader", "stream-follower")


def _client(
    mode: str, env: dict, token: str, leases: list[int], endpoint: str, period_s: float, seconds: float, out, go
) -> None:
    os.nice(10)
    creds = ClientCredentials.from_env(env)
    if mode == "gateway":  # each lease its own client (its own connections), as each agent has
        clients = {lease: EtcdClient(creds) for lease in leases}
        for client in clients.values():
            client._token = token  # one login for all (logins are measured apart: python -m tools.login_cost)
        renew = lambda lease: clients[lease].post("lease/keepalive", {"ID": str(lease)})  # noqa: E731
    else:  # the client's own stream class, pinned to one member (no leader lookup)
        streams = {
            lease: LeaseKeepAliveStream(
                [endpoint],
                creds.ca,
                creds.cert,
                creds.key,
                find_leader=lambda _timeout_s: endpoint,
                token=lambda: token,
            )
            for lease in leases
        }
        renew = lambda lease: streams[lease].renew(lease, 1.0, 5.0)  # noqa: E731
    for lease in leases:  # each connection opened before the clock starts
        renew(lease)
    out.put("ready")
    go.wait()  # every client set up (imports, connections) before the clock starts: only renewals are measured
    done = late = 0
    cpu0 = time.process_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lap = time.monotonic()
        for lease in leases:
            renew(lease)
            done += 1
        took = time.monotonic() - lap
        late += took > period_s
        time.sleep(max(0.0, period_s - took))
    if mode != "gateway":
        for stream in streams.values():
            stream.close()
    out.put((done, late, time.process_time() - cpu0))


def _collect(out, workers: list, what: str, timeout_s: float) -> list:
    """One message from each client process; a client that died or a wait past `timeout_s` is an error."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < len(workers):
        try:
            got.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"keep-alive clients failed before {what} (exit codes {dead}, "
                    f"{len(got)} of {len(workers)} answered)"
                ) from None
    return got


def measure(mode: str, leases: int, seconds: float, procs: int, workdir: str) -> dict:
    """One row: a fresh etcd, ``leases`` leases renewed the launcher's way for ``seconds``."""
    period_s = ETCD_MIN_LEASE_S / 3
    with LocalEtcd.start(tempfile.mkdtemp(dir=workdir)) as etcd:
        creds = etcd.add_job_user("keepalive-cost")
        admin = EtcdClient(creds)
        ids = [admin.grant(60) for _ in range(leases)]
        leader = etcd.leader()
        follower = next(m for m in etcd.members if m is not leader)
        endpoint = (follower if mode == "stream-follower" else leader).client_url
        pids = [m.process.pid for m in etcd.members]
        ctx = mp.get_context("spawn")
        out, go = ctx.Queue(), ctx.Event()
        workers = [
            ctx.Process(
                target=_client,
                args=(mode, creds.as_env(), admin._token, ids[k::procs], endpoint, period_s, seconds, out, go),
            )
            for k in range(procs)
        ]
        for w in workers:
            w.start()
        _collect(out, workers, "they were ready", 300)
        members_before, start = sum(cpu_s(p) for p in pids), time.monotonic()
        go.set()
        results = _collect(out, workers, "they reported", 300 + seconds)
        wall = time.monotonic() - start
        members = sum(cpu_s(p) for p in pids) - members_before
        for w in workers:
            w.join()
    return {
        "mode": mode,
        "leases": leases,
        "needed_per_s": leases / period_s,
        "done_per_s": sum(r[0] for r in results) / wall,
        "members_cpu_pct": 100 * members / wall,
        "clients_cpu_pct": 100 * sum(r[2] for r in results) / wall,
        "late_laps": sum(r[1] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.keepalive_cost",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--leases", default="256,1024", help="lease counts, comma-separated (default 256,1024)")
    p.add_argument("--modes", default=",".join(MODES), help=f"which transports (default {','.join(MODES)})")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of renewals per row (default 20)")
    p.add_argument("--procs", type=int, default=8, help="client processes (default 8)")
    args = p.parse_args(argv)
    try:
        counts = [int(n) for n in args.leases.split(",")]
        modes = args.modes.split(",")
        if any(n < 1 for n in counts) or any(m not in MODES for m in modes) or args.seconds <= 0 or args.procs < 1:
            raise ValueError
    except ValueError:
        p.error(
            f"--leases takes positive integers, --modes some of {', '.join(MODES)}, --seconds and --procs "
            f"positive numbers (got --leases {args.leases} --modes {args.modes})"
        )
    print(
        f"[keepalive-cost] lease TTL {ETCD_MIN_LEASE_S} s, renewed every {ETCD_MIN_LEASE_S / 3:.2f} s; "
        f"{args.procs} client processes; {args.seconds:g} s per row",
        file=sys.stderr,
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="t5-keepalive-cost-") as workdir:
        for n in counts:
            for mode in modes:
                rows.append(measure(mode, n, args.seconds, args.procs, workdir))
                r = rows[-1]
                print(
                    f"[keepalive-cost] {mode} {n}: {r['done_per_s']:.0f} of {r['needed_per_s']:.0f} renewals/s, "
                    f"members {r['members_cpu_pct']:.0f} %",
                    file=sys.stderr,
                    flush=True,
                )
    print("\n| transport | leases | renewals/s needed | renewals/s done | members CPU % | clients CPU % | late laps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['leases']} | {r['needed_per_s']:.0f} | {r['done_per_s']:.0f} | "
            f"{r['members_cpu_pct']:.0f} | {r['clients_cpu_pct']:.0f} | {r['late_laps']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
