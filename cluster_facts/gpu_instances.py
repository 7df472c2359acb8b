"""GPU instance types the platforms support, with the facts the stacks and the job renderers need per type.

Why a table: the number of EFA interfaces a launch template must declare equals the instance's number of
network cards (one EFA per card), and getting it wrong either fails at launch or silently leaves bandwidth
unused. aws-cdk-lib's own GPU list also misses the p5 family (a p5 with the NVIDIA AMI type fails at synth),
so the stacks do not rely on it. Figures are from the EC2 accelerated-computing instance specifications.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInstanceSpec:
    """Hardware facts of one GPU instance type."""

    instance_type: str
    """EC2 instance type name, e.g. ``p5.48xlarge``."""
    gpus: int
    """NVIDIA GPUs per instance (the ``nvidia.com/gpu`` resource a node advertises)."""
    gpu_model: str
    """GPU model and memory, for docs and error messages."""
    network_cards: int
    """Network cards; a launch template can attach at most one interface per card."""
    efa_interfaces: int
    """EFA interfaces to attach (one per network card: the first ``efa``, the rest ``efa-only``)."""
    gpudirect_rdma: bool = False
    """Its EFA supports GPUDirect RDMA (GPU memory to the NIC without a host copy): the p4d and p5 families.
    Asking libfabric for device RDMA on a type without it fails the NCCL network set-up."""

    def __post_init__(self) -> None:
        if not 1 <= self.efa_interfaces <= self.network_cards:
            raise ValueError(f"{self.instance_type}: efa_interfaces must be 1..network_cards")

    @property
    def compute_resource_name(self) -> str:
        """A name for this type that ParallelCluster accepts (``[a-z][a-z0-9-]*``), e.g. ``p5-48xlarge``."""
        return self.instance_type.replace(".", "-")


GPU_INSTANCES: dict[str, GpuInstanceSpec] = {
    spec.instance_type: spec
    for spec in (
        GpuInstanceSpec(
            "p4d.24xlarge", gpus=8, gpu_model="A100 40 GB", network_cards=4, efa_interfaces=4, gpudirect_rdma=True
        ),
        GpuInstanceSpec(
            "p4de.24xlarge", gpus=8, gpu_model="A100 80 GB", network_cards=4, efa_interfaces=4, gpudirect_rdma=True
        ),
        GpuInstanceSpec(
            "p5.48xlarge", gpus=8, gpu_model="H100 80 GB", network_cards=32, efa_interfaces=32, gpudirect_rdma=True
        ),
        GpuInstanceSpec(
            "p5e.48xlarge", gpus=8, gpu_model="H200 141 GB", network_cards=32, efa_interfaces=32, gpudirect_rdma=True
        ),
        GpuInstanceSpec(
            "p5en.48xlarge", gpus=8, gpu_model="H200 141 GB", network_cards=16, efa_interfaces=16, gpudirect_rdma=True
        ),
        GpuInstanceSpec("g6e.48xlarge", gpus=8, gpu_model="L40S 48 GB", network_cards=4, efa_interfaces=4),
        GpuInstanceSpec("g5.48xlarge", gpus=8, gpu_model="A10G 24 GB", network_cards=1, efa_interfaces=1),
    )
}


def gpu_instance(instance_type: str) -> GpuInstanceSpec:
    """Look up ``instance_type``; raise ``ValueError`` naming the supported types if it is unknown."""
    try:
        return GPU_INSTANCES[instance_type]
    except KeyError:
        raise ValueError(
            f"gpuInstanceType={instance_type!r} is not a supported GPU instance type; use one of "
            f"{', '.join(sorted(GPU_INSTANCES))} (or add it to cluster_facts/gpu_instances.py with its GPU and "
            f"network-card counts)"
        ) from None
