"""What N agents logging in at once cost a 3-member etcd, at each bcrypt cost of its password hashes.

    python -m tools.login_cost --logins 256,1024 --bcrypt-cost 10,4

Every agent logs in to the store once when it starts, and again whenever its token expires (the members' JWTs
last 10 minutes, so the agents of one job, started together, all log in again together). A login checks the
password against its bcrypt hash on the member that takes it. For each cost and N: a fresh 3-member etcd (TLS,
auth on, as the launcher starts it), one job user, and N clients, each with its own connections as each agent
has, logging in through ``--threads`` threads at once. Printed per row: seconds until every client was in, the
members' CPU seconds (all three) and the members' milliseconds per login. The first row of each cost is the
one to read for a job's start; TLS handshakes are in every row (each client opens its own connection).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import time

from cluster_facts.versions import BCRYPT_COST
from training.launch.rendezvous.client import EtcdClient
from training.launch.rendezvous.members import LocalEtcd
from tools.rdzv_scale import cpu_s


def _counts(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected positive whole numbers separated by commas, e.g. 256,1024"
        )
    return values


def _costs(text: str) -> list[int]:
    values = _counts(text)
    if min(values) < 4 or max(values) > 31:
        raise argparse.ArgumentTypeError(
            f"{text!r}: etcd's bcrypt cost is 4 to 31 (its default 10, ours {BCRYPT_COST})"
        )
    return values


def measure(cost: int, logins: int, threads: int) -> tuple[float, float]:
    """(seconds until ``logins`` clients were all logged in, the members' CPU seconds meanwhile) at ``cost``."""
    with LocalEtcd.start(tempfile.mkdtemp(prefix="t5-login-cost-"), die_with_parent=True, bcrypt_cost=cost) as etcd:
        creds = etcd.add_job_user("login-cost")
        clients = [EtcdClient(creds) for _ in range(logins)]
        pids = [m.process.pid for m in etcd.members]
        cpu0, t0 = sum(map(cpu_s, pids)), time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            # a read under the job's prefix logs in first (what an agent's first call does)
            list(pool.map(lambda c: c.get(c.key("login-cost")), clients))
        return time.monotonic() - t0, sum(map(cpu_s, pids)) - cpu0


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(
        prog="python -m tools.login_cost",
        description=doc[0],
        epilog="\n\n".join(doc[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--logins", type=_counts, default=[256], help="clients logging in at once (default 256)")
    p.add_argument(
        "--bcrypt-cost",
        type=_costs,
        default=[10, BCRYPT_COST],
        help=f"the members' bcrypt costs to compare (default 10,{BCRYPT_COST}: etcd's default, ours)",
    )
    p.add_argument("--threads", type=int, default=32, help="client threads logging in at once (default 32)")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error(f"--threads {a.threads}: expected at least 1, e.g. 32")
    print(f"{'bcrypt cost':>11} {'logins':>7} {'all in s':>9} {'members cpu s':>14} {'ms/login':>9}", flush=True)
    for cost in a.bcrypt_cost:
        for n in a.logins:
            wall, cpu = measure(cost, n, a.threads)
            print(f"{cost:>11} {n:>7} {wall:>9.2f} {cpu:>14.2f} {cpu / n * 1000:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
