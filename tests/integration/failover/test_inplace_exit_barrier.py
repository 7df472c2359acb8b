"""The in-place agent's exit barrier (training.launch.inplace_agent.InPlaceAgent._exit_barrier) waits on the store of
the round its node holds a place in *now* (the rendezvous handler's ``place_store()``), not on the one torchrun got
when the workers started: when rank 0's node is lost in place, that store went with it and a spare's agent serves
the round's (chaos: ``first-node-kill-in-place``). Real ``TCPStore`` servers; the handler is a stand-in that
only names the store (the real one's ``place_store`` is what its take-over connected to: the chaos scenario)."""

from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

from training.launch import inplace_agent


class PlacedHandler:
    """What the agent asks of its rendezvous handler here: the run id and the store of its current place."""

    def __init__(self, store):
        self.store = store

    def place_store(self):
        return self.store

    def get_run_id(self) -> str:
        return "exit-barrier"


def agent(tmp_path, name: str, store, group_world_size: int, timeout_s: float) -> inplace_agent.InPlaceAgent:
    spec = WorkerSpec(role="trainer", local_world_size=1, rdzv_handler=PlacedHandler(store), entrypoint="true")
    a = inplace_agent.InPlaceAgent(
        spec,
        DefaultLogsSpecs(log_dir=str(tmp_path / name)),
        board_for_round=lambda: None,
        member_id=lambda rank, pid: f"r{rank}-{pid}",
        exit_barrier_timeout=timeout_s,
    )
    a.get_worker_group().group_world_size = group_world_size
    return a


def server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)


def client(port: int, prefix: str = "t5f/round/0"):
    tcp = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    return dist.PrefixStore(prefix, tcp)


def run_barriers(agents) -> tuple[list[float], list[threading.Thread]]:
    ended: list[float] = []
    threads = [threading.Thread(target=lambda a=a: (a._exit_barrier(), ended.append(time.monotonic()))) for a in agents]
    for t in threads:
        t.start()
    return ended, threads


def test_the_survivor_and_the_spare_meet_on_the_store_of_the_round_they_hold_now(tmp_path, capsys):
    spares_server = server()  # the spare's agent took node rank 0: the round's store is its agent's now
    survivor = agent(tmp_path, "survivor", client(spares_server.port), 2, timeout_s=20)
    spare = agent(tmp_path, "spare", client(spares_server.port), 2, timeout_s=20)
    began = time.monotonic()
    ended, threads = run_barriers([survivor, spare])
    for t in threads:
        t.join(15)
    assert len(ended) == 2 and max(ended) - began < 15, "both agents left the barrier"
    assert "exit barrier failed" not in capsys.readouterr().err
    # the barrier counted both on that store, under this module's key
    assert int(client(spares_server.port).get(f"{inplace_agent.EXIT_BARRIER_KEY}/num_members")) == 2


def test_an_agent_alone_waits_for_the_others_and_says_so_when_they_never_come(tmp_path, capsys):
    """The barrier is real: the spare alone (the survivors gone elsewhere) waits its whole timeout, then says why
    in one ``[agent] in-place:`` line and ends without raising (its workers finished)."""
    store_server = server()
    spare = agent(tmp_path, "spare", client(store_server.port), 2, timeout_s=1.5)
    began = time.monotonic()
    spare._exit_barrier()
    waited = time.monotonic() - began
    out = capsys.readouterr().err
    assert waited >= 1.4
    assert f"{inplace_agent.PREFIX} the agents' exit barrier failed after" in out
    assert "this node's workers finished" in out
