"""The job's keys in etcd, as the handler's parts write and read them, and the line they say things in.

Under the job's prefix (``rdzv/<run id>/``): ``members/<id>`` (each agent's, under its lease: what
:func:`member_values` reads), ``joined/<n>/<id>``, ``left/<n>/<id>``, ``taken-out/<id>``, ``round`` (the whole
record), ``head`` (the record without its member lists, which every agent watches), ``seats/<n>/<page>``
(:func:`seats_key`) and ``ended``. A round is written by one transaction, :func:`put_round`.
"""

from __future__ import annotations

import json
import sys

from training.launch.rendezvous import rounds
from training.launch.rendezvous.client import EtcdClient, KeyValue


def say(line: str) -> None:
    """One line on stderr, as every part of the handler says what it does (``[rendezvous] ...``)."""
    print(f"[rendezvous] {line}", file=sys.stderr, flush=True)


def put_round(
    client: EtcdClient,
    prefix: str,
    revision: int,
    new: rounds.Round,
    seats: bool = False,
    extra: dict[str, str] | None = None,
) -> bool:
    """One transaction under the job's ``prefix``: the round record compare-and-set on its ``revision`` (0: none
    yet) and its head; with ``seats`` (the round is being formed) also its seat pages, older rounds' pages
    deleted (at most :data:`.rounds.MAX_ROUND_NODES` participants fit); ``extra``: more keys put with them."""
    also, drop = {prefix + "head": rounds.Head.of(new).dumps(), **(extra or {})}, None
    if seats:
        also |= {seats_key(prefix, new.n, k): page.dumps() for k, page in rounds.seat_pages(new).items()}
        drop = (prefix + "seats/", seats_key(prefix, new.n, ""))  # zero-padded: older rounds sort first
    return client.compare_and_set(prefix + "round", revision, new.dumps(), also=also, drop=drop)


def member_values(live: dict[str, KeyValue]) -> tuple[dict[str, dict], set[str], dict[str, int]]:
    """The live members' key values (what each agent wrote when it joined the job), those that asked to stand
    by, and the node index each gave."""
    values = {i: json.loads(k.value or "{}") for i, k in live.items()}
    standby = {i for i, v in values.items() if v.get("standby")}
    node_index = {i: v["node"] for i, v in values.items() if isinstance(v.get("node"), int)}
    return values, standby, node_index


def seats_key(prefix: str, n: int, page: int | str) -> str:
    """The key of formed round ``n``'s seat ``page`` under the job's ``prefix``."""
    return prefix + f"seats/{n:08d}/{page}"
