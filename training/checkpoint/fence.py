"""The commit fence: a worker group whose rendezvous round was replaced can never complete a checkpoint.

The window it closes: a group whose agent lost etcd (a partition, or the agent frozen or dead while its workers
train on) goes on training while spares form a newer round; both groups would write into the same checkpoint
directory. Rank 0 asks etcd before every commit marker (:meth:`EtcdFence.commit`, the storage tier's
``before_commit``) in one transaction, under the job's rendezvous prefix:

* compare: round ``G``'s seat page 0 still exists (the transaction that forms any later round deletes older
  rounds' pages, :func:`training.launch.rendezvous.layout.put_round`), i.e. ``G`` is still the newest formed round;
* then: record ``commits/<step>`` = ``{"round": G, ...}``; else: read the head (which round replaced it).

Refused: :class:`~training.errors.StaleGroup` with one line naming the rounds; the step's directory never gets its
marker (the storage tier discards it) and every rank stops at the next step boundary (exit 9). No member answers:
the commit goes ahead, recorded in the marker as ``unconfirmed`` (the membership store may go down whole and
training goes on), and a later restore can still tell it from the current group's: each group records the step it
restored from (:meth:`EtcdFence.record_restore`, ``restored/<G>``), and :func:`.stale_rule.stale_checkpoints`
sets aside what a replaced group wrote after that (:meth:`EtcdFence.set_aside_stale`; in-memory snapshots carry
their round too and are skipped by the same rule, :mod:`.memory`).

Every marker carries its generation (``fence.round``) either way. Without a generation (no etcd rendezvous: c10d,
a local run) the fence is :class:`NoFence`, which does nothing; other ranks than 0 never talk to etcd.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from training.checkpoint import generation as generation_note
from training.checkpoint.layout import SUPERSEDED, parse_step, read_marker, scan
from training.checkpoint.stale_rule import stale_checkpoints
from training.errors import StaleGroup

log = logging.getLogger("training")


class NoFence:
    """No etcd rendezvous (or not rank 0): every commit goes ahead, nothing is recorded or set aside."""

    round: int | None = None

    def commit(self, step: int) -> dict:
        """The fields the commit marker gets (none)."""
        return {}

    def record_restore(self, step: int) -> None:
        pass

    def restores(self) -> dict[int, int] | None:
        return {}

    def set_aside_stale(self, root: Path, restored: dict[int, int]) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _say(line: str) -> None:
    sys.stderr.write(f"[fence] {line}\n")
    sys.stderr.flush()


class EtcdFence:
    """Rank 0's fence for the group of round ``gen`` of the job whose keys are under ``gen.prefix`` (see the
    module docstring); ``client``: an :class:`~training.launch.rendezvous.client.EtcdClient` with the job's
    credentials."""

    def __init__(self, client, gen: generation_note.Generation):
        self.client, self.gen, self.round = client, gen, gen.round
        self._said_outage = False

    def _key(self, suffix: str) -> str:
        return self.gen.prefix + suffix

    def commit(self, step: int) -> dict:
        """Before ``step``'s marker: the marker's ``fence`` fields; raises :class:`StaleGroup` when a newer round
        replaced this group's."""
        from training.launch.rendezvous.client import StoreRefused, StoreUnavailable, b64
        from training.launch.rendezvous.layout import seats_key

        seat = seats_key(self.gen.prefix, self.round, 0)
        record = json.dumps({"round": self.round, "step": step, "time": time.time()})
        try:
            r = self.client.post(
                "kv/txn",
                {
                    "compare": [{"key": b64(seat), "target": "CREATE", "result": "NOT_EQUAL", "create_revision": "0"}],
                    "success": [{"request_put": {"key": b64(self._key(f"commits/{step:012d}")), "value": b64(record)}}],
                    "failure": [{"request_range": {"key": b64(self._key("head"))}}],
                },
            )
        except (StoreUnavailable, StoreRefused) as e:
            if not self._said_outage:
                _say(
                    f"the membership store did not confirm round {self.round}'s commit of step {step} ({e}); "
                    f"committing it unconfirmed (training goes on while the store is away)"
                )
                self._said_outage = True
            return {"fence": {"round": self.round, "confirmed": False}}
        self._said_outage = False
        if not r.get("succeeded"):
            raise StaleGroup(self._replaced_line(step, r))
        return {"fence": {"round": self.round, "confirmed": True, "revision": int(r["header"]["revision"])}}

    def _replaced_line(self, step: int, answer: dict) -> str:
        from training.launch.rendezvous import rounds
        from training.launch.rendezvous.client import unb64

        kvs = (answer.get("responses") or [{}])[0].get("response_range", {}).get("kvs", [])
        head = rounds.Head.loads(unb64(kvs[0]["value"])) if kvs else None
        by = f"round {head.n}" if head else "a newer round"
        why = f" (it replaced lost node(s) {', '.join(head.lost)})" if head and head.lost else ""
        return (
            f"this worker group (round {self.round}) was replaced by {by}{why}: the commit fence refused its "
            f"checkpoint of step {step} (not completed); stopping, the job goes on in {by}"
        )

    def record_restore(self, step: int) -> None:
        """After the restore: the step this round's group starts from (0: fresh), for :func:`stale_checkpoints`."""
        try:
            self.client.put(self._key(f"restored/{self.round:08d}"), str(step))
        except Exception as e:  # noqa: BLE001 - the store away: this round's restore is then not known later
            _say(f"could not record round {self.round}'s restore from step {step} ({e})")

    def restores(self) -> dict[int, int] | None:
        """Generation -> the step its group restored from, as recorded; None when the store does not answer."""
        try:
            kvs, _ = self.client.get_prefix(self._key("restored/"))
        except Exception:  # noqa: BLE001 - nothing set aside on an outage (the rule needs the record)
            return None
        return {int(kv.key.rsplit("/", 1)[1]): int(kv.value) for kv in kvs if kv.value.isdigit()}

    def set_aside_stale(self, root: Path, restored: dict[int, int]) -> list[str]:
        """Move the complete checkpoints a replaced group wrote (:func:`stale_checkpoints`, given ``restored``,
        :meth:`restores`) to ``superseded/``, each named with why; returns where they went."""
        if not restored:
            return []
        good, _ = scan(root)
        gens = {parse_step(p): (read_marker(p).get("fence") or {}).get("round") for p in good}
        moved = []
        for step, why in sorted(stale_checkpoints(gens, restored).items()):
            src = next(p for p in good if parse_step(p) == step)
            dest = Path(root) / SUPERSEDED / f"{src.name}.stale-round-{gens[step]}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
            log.warning("WARNING: checkpoint %s not used: %s; moved to %s (kept)", src, why, dest)
            moved.append(str(dest))
        return moved

    def close(self) -> None:
        self.client.close()


def build(rank: int) -> NoFence | EtcdFence:
    """Rank 0 of a group its ``t5-etcd`` agent noted a round for gets an :class:`EtcdFence` over the job's
    credentials (``T5_ETCD_*``, inherited from the agent); everyone else a :class:`NoFence`."""
    gen = generation_note.read()
    if rank != 0 or gen is None:
        return NoFence()
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient

    return EtcdFence(EtcdClient(ClientCredentials.from_env()), gen)
