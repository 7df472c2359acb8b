"""The commit fence's etcd side: rank 0 of a worker group asks the job's rendezvous whether its round is current.

Before every commit marker (:mod:`training.checkpoint.fence`, the storage tier's ``before_commit``), one transaction
under the job's rendezvous prefix:

* compare: round ``G``'s seat page 0 still exists (the transaction that forms any later round deletes older rounds'
  pages, :func:`.layout.put_round`), i.e. ``G`` is still the newest formed round;
* then: record ``commits/<step>`` = ``{"round": G, ...}``; else: read the head (which round replaced it).

Refused: :class:`~training.errors.StaleGroup`, one line naming both rounds. No member answers (or one refuses): the
commit goes ahead, its marker says ``"confirmed": false``. Each group records the step it restored from
(``restored/<G>``), read back by the next restore for the stale rule. The workers this project's agent starts
install it (:func:`install`, from :mod:`training.launch.worker` and :func:`training.launch.warm_workers.run_worker`),
with the job's ``T5_ETCD_*`` credentials they inherit from the agent; the checkpoint room only knows the
:class:`~training.checkpoint.fence.Fence` it is given, as it may not import this room.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from training.checkpoint import fence as checkpoint_fence
from training.checkpoint.fence import set_aside_stale
from training.checkpoint.generation import Generation
from training.errors import StaleGroup

log = logging.getLogger("training")


def _say(line: str) -> None:
    # through the training logger, never a raw write: a worker whose launcher died (its output pipe gone) must
    # still commit the stop checkpoint this line is about; logging swallows a broken pipe, a write would raise
    log.warning("[fence] %s", line)


class EtcdFence:
    """Rank 0's fence for the group of round ``gen`` of the job whose keys are under ``gen.prefix`` (see the
    module docstring); ``client``: an :class:`~training.launch.rendezvous.client.EtcdClient` with the job's
    credentials."""

    def __init__(self, client, gen: Generation):
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
        return set_aside_stale(root, restored)

    def close(self) -> None:
        self.client.close()


def install() -> None:
    """Make rank 0 of a group whose agent noted a round build an :class:`EtcdFence` (in a worker process)."""
    checkpoint_fence.register(_build)


def _build(gen: Generation) -> EtcdFence:
    from training.launch.rendezvous.client import ClientCredentials, EtcdClient

    return EtcdFence(EtcdClient(ClientCredentials.from_env()), gen)
