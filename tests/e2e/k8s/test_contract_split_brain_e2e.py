"""End to end: the split brain on the Kubernetes contract emulator (the shipped runtime + TrainJob as real processes,
a real 3-member etcd, the real commit fence), in the smallest job with two worker groups: one training pod and one
hot-spare pod (``--nodes 1 --spares 1``).

``--fault freeze-agents:training@3``: once step 3 is logged the training pod's torchrun agent (only) is SIGSTOPped,
its worker trains on, held at a step boundary until the spare pod's agent formed a newer round and runs workers; let
go, the old group is refused by the commit fence at its next commit (one line, exit 9); the Job controller replaces
that pod without counting it (podFailurePolicy Ignore; the new pod waits as a hot spare, never needed), the new group
restores and finishes. Judged by the common verdict (fault confirmed, noticed, recovered, steps recomputed, every
sample once, weights bitwise equal to an uninterrupted run) plus the fence's evidence and Kubernetes' promise (no
JobSet restart, TrainJob Complete). Without the fault or the Ignore rule the verdict fails:
tests/unit/k8s/test_split_brain_k8s_verdict.py."""

from __future__ import annotations

import re

import pytest

from chaos.kubernetes import FENCED_PODS_REPLACED
from chaos.local.split_brain import STALE_GROUP_FENCED
from tests.e2e.k8s.test_contract_e2e import RECOVERED, STEPS, TRAIN_ARGS, emulate, passed
from tests.support.k8s import render
from tests.support.reference import cached_reference

pytestmark = pytest.mark.e2e
NAME = "t5-contract-split"
CLI = ("--nodes", "1", "--spares", "1")


def test_the_fence_stops_the_frozen_pods_group_kubernetes_replaces_it_uncounted_bitwise(tmp_path, capsys):
    # The reference: the TrainJob's own training arguments, uninterrupted, at the same world size (1), through
    # torchrun on one process (the launcher and etcd decide when, not what), cached after the first run.
    _, trainjob, _ = render(NAME, *TRAIN_ARGS, cli=CLI)
    ref = cached_reference(trainjob["spec"]["trainer"]["args"], 1, STEPS, tmp_path)
    chaos, rep, _ = emulate(tmp_path, NAME, "freeze-agents:training@3", reference=ref, cli=CLI)
    checks = passed(chaos, rep, tmp_path, NAME, "split-brain", capsys)
    assert {*RECOVERED, "steps recomputed <= 4", STALE_GROUP_FENCED, FENCED_PODS_REPLACED} <= set(checks)
    assert re.search(r"was replaced by round \d+ .*refused its checkpoint of step \d+", checks[STALE_GROUP_FENCED])
    # Kubernetes: the fenced pod (exit 9) replaced without a counted failure, the spare's pod ran start to end (which
    # index trains is the rendezvous' join order)
    assert rep["jobset_restarts"] == 0 and rep["pod_failures"] == 1
    (spare,), (old, new) = sorted(rep["pods"]["node"].values(), key=len)
    assert (old["exit_code"], new["why"], new["exit_code"], spare["exit_code"]) == (9, "replaced (Ignore)", 0, 0)
    replacement = (tmp_path / f"{NAME}-pods" / f"{new['name']}.log").read_text()
    assert "hot spare: the job finished without needing this node" in replacement, replacement[-1500:]
