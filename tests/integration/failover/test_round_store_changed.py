"""A round whose rank-0 node left for a newer round while this node read its store: the node takes a place in the
newer round (RoundChanged, as when connecting), and only a rank 0 gone while its round is still current is the
rendezvous error. Seen in a full run under load: two lost nodes' leases ended one after the other, the spares formed
a round for each, and the spare that read round 1's store when its rank 0 moved to round 2 ended its agent (exit 1)
with "its rank-0 node did not take its place", so the new worker group never trained."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import RendezvousError

from training.launch.rendezvous import rounds
from training.launch.rendezvous.round_store import RoundChanged, RoundStore


def read_info_after_rank0_left(current_round: int):
    """Round 1's store on a rank-0 server that closes before it publishes the workers' address; this node's
    watch shows round ``current_round``."""
    rank0 = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    mine = RoundStore("127.0.0.1", 5.0, lambda: (rounds.Head(n=current_round, formed=True), 0))
    r = rounds.Round(n=1, formed=True, store=f"127.0.0.1:{rank0.port}")
    client = mine.connect(r)
    del rank0  # its agent left round 1 (for round 2, or gone): the connection closes
    try:
        return mine.info(r, 1, client)
    finally:
        del mine


def test_a_rank0_gone_to_a_newer_round_sends_this_node_there():
    with pytest.raises(RoundChanged):
        read_info_after_rank0_left(current_round=2)


def test_a_rank0_gone_while_its_round_is_current_is_a_rendezvous_error():
    with pytest.raises(RendezvousError, match="round 1: its rank-0 node"):
        read_info_after_rank0_left(current_round=1)
