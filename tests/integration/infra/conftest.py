"""Session fixtures: each app is synthesized once (10-30 s each on 2 shared cores) and shared by all tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.infra import ROOT, Synthesized, synthesize

#: The ParallelCluster app deliberately differs from the defaults: another instance type, more nodes and
#: an imported bucket, so the non-default code paths are synthesized and validated too.
PCLUSTER_CONTEXT = {
    "platform": "parallelcluster",
    "gpuInstanceType": "p4d.24xlarge",
    "gpuNodes": "4",
    "bucketName": "example-existing-training-bucket",
    "s3Prefix": "t5/",
}


@pytest.fixture(scope="session")
def eks(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The default EKS app (p5.48xlarge x 2, created bucket), synthesized with cdk-nag."""
    return synthesize({"platform": "eks"}, tmp_path_factory.mktemp("cdk-eks"))


#: An EKS deploy into a Capacity Block (far in the future: both of its scaling schedules are synthesized).
CAPACITY_BLOCK_CONTEXT = {
    "platform": "eks",
    "capacityReservationId": "cr-0123456789abcdef0",
    "placementGroup": "false",
    "availabilityZones": "us-east-1c,us-east-1a",
    "capacityBlock": "true",
    "capacityBlockStart": "2099-03-01T11:30:00Z",
    "capacityBlockEnd": "2099-03-03T11:30:00Z",
}


@pytest.fixture(scope="session")
def eks_capacity_block(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The EKS app launching its GPU nodes into a Capacity Block (CAPACITY_BLOCK_CONTEXT), with cdk-nag."""
    return synthesize(CAPACITY_BLOCK_CONTEXT, tmp_path_factory.mktemp("cdk-eks-block"))


@pytest.fixture(scope="session")
def pcluster(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The ParallelCluster app (see PCLUSTER_CONTEXT), synthesized with cdk-nag."""
    return synthesize(PCLUSTER_CONTEXT, tmp_path_factory.mktemp("cdk-pcluster"))


@pytest.fixture(scope="session")
def pcluster_python() -> Path:
    """Python of .venv-pcluster (aws-parallelcluster 3.16.1), created by scripts/pcluster_venv.sh.

    Skips (with the installer's error) only when the venv cannot be created, e.g. no package index."""
    proc = subprocess.run([str(ROOT / "scripts" / "pcluster_venv.sh")], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.skip(
            f"cannot create .venv-pcluster (scripts/pcluster_venv.sh rc={proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}"
        )
    return Path(proc.stdout.strip().splitlines()[-1])
