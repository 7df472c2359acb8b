"""The infrastructure configuration: CDK context read once into a frozen, validated dataclass.

``app.py`` is the only place that reads context (``InfraConfig.from_context``); constructs get typed
keyword-only props derived from this object and never look at context or the environment themselves.

Every field maps to one camelCase context key (``cdk.json`` documents them all under ``"//"``; a test keeps
the two in sync). Values given with ``cdk synth -c key=value`` arrive as strings and are coerced to the
field's type here. Invalid values and bad combinations raise :class:`ConfigError` at synth time, naming the
context key, the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, get_type_hints

from cluster_facts import (
    DEFAULT_GPU_INSTANCE_TYPE,
    DEFAULT_IMAGE_TAG,
    DEFAULT_MAX_RESTARTS,
    GPU_INSTANCES,
    RUNTIME_NAME,
    TRAINING_NAMESPACE,
    GpuInstanceSpec,
    gpu_instance,
)
from stacks import context_keys as ctx_keys
from training.field_docs import field_docs as _field_docs

PLATFORMS = ("eks", "parallelcluster")
#: Kubernetes versions the pinned kubectl layer (v1.35) may manage: kubectl supports +-1 minor version skew.
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36")
#: FSx for Lustre PERSISTENT_2 throughput tiers, MB/s per TiB of storage.
FSX_THROUGHPUT_TIERS = (125, 250, 500, 1000)
#: An EC2 instance type name: family (letters, generation digit(s), attribute letters, e.g. m7i, c7gn, m7i-flex,
#: u-6tb1, mac2-m2pro) '.' size (nano .. medium, large, xlarge, Nxlarge, metal, metal-Nxl). A typo such as
#: m7i.2xlarg or m7i.big would otherwise fail only at deploy time, minutes into CloudFormation.
EC2_INSTANCE_TYPE = re.compile(
    r"[a-z]+-?\d+[a-z0-9-]*\."
    r"(?:nano|micro|small|medium|large|xlarge|\d+xlarge|metal(?:-\d+xl)?)"
)
#: The aws-parallelcluster release the provider stack and the schema test both use.
PCLUSTER_VERSION = "3.16.1"
#: Top-level /fsx directories (= S3 prefixes under s3Prefix) where the jobs of each platform write checkpoints
#: and metrics; the nodes' and pods' S3 write grants are limited to them (tests check them against the renderers).
EKS_JOB_DIRS = ("jobs",)
SLURM_JOB_DIRS = ("checkpoints", "runs")
#: An EC2 capacity reservation id (On-Demand Capacity Reservation or Capacity Block for ML).
CAPACITY_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{8,17}")


class InstanceTypes(frozenset):
    """Every EC2 instance type name of one botocore release (``version``)."""

    version: str = ""


@functools.lru_cache(maxsize=1)
def ec2_instance_types() -> InstanceTypes | None:
    """The EC2 API's instance types as the pinned botocore knows them (its EC2 model's ``InstanceType`` enum),
    so a type that matches the name pattern but does not exist (m7i.3xlarge) is refused at synth; None without
    botocore (then only the pattern is checked)."""
    try:
        import botocore
        import botocore.session
    except ImportError:  # pragma: no cover - requirements.txt pins boto3, which brings it
        return None
    names = InstanceTypes(botocore.session.get_session().get_service_model("ec2").shape_for("InstanceType").enum)
    names.version = botocore.__version__
    return names


class ConfigError(ValueError):
    """A context value or combination of values that cannot be deployed. The message names the fix."""


#: How long before a Capacity Block ends the EKS GPU node group is scaled to 0: the nodes drain (TrainJobs get
#: their SIGTERM checkpoint) before EC2 reclaims the instances (AWS advises more than 30 minutes).
CAPACITY_BLOCK_DRAIN = datetime.timedelta(minutes=40)


def _utc(text: str) -> datetime.datetime:
    """An ISO 8601 time with an explicit UTC offset, as UTC (ValueError otherwise)."""
    when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"{text}: no time zone")
    return when.astimezone(datetime.timezone.utc)


def _key(name: str, *, eks_only: bool = False) -> dict[str, object]:
    """Field metadata: the context key a field is read from, and whether only the EKS stacks read it."""
    return {"context_key": name, "eks_only": eks_only}


@dataclass(frozen=True)
class InfraConfig:
    """Everything the stacks need, validated. Build it with :meth:`from_context` (or directly in tests)."""

    platform: str = field(default="eks", metadata=_key("platform"))
    """Which GPU platform to synthesize next to the shared network and storage: ``eks`` or ``parallelcluster``."""

    account: Optional[str] = field(default=None, metadata=_key("account"))
    """AWS account id (12 digits). Unset = environment-agnostic stacks, which synthesize offline."""

    region: Optional[str] = field(default=None, metadata=_key("region"))
    """AWS region, e.g. ``us-east-1``. Unset = environment-agnostic (the deploy-time CLI region is used)."""

    name_prefix: str = field(default="t5ft", metadata=_key("namePrefix"))
    """Prefix of stack, cluster and resource names (lowercase letters, digits, hyphens; 2-20 chars)."""

    gpu_instance_type: str = field(default=DEFAULT_GPU_INSTANCE_TYPE, metadata=_key("gpuInstanceType"))
    """GPU instance type, one of ``cluster_facts.GPU_INSTANCES`` (sets GPUs and EFA interfaces per node)."""

    gpu_nodes: int = field(default=2, metadata=_key("gpuNodes"))
    """Number of GPU nodes (EKS: node group size; ParallelCluster: the Slurm queue's MaxCount)."""

    placement_group: bool = field(default=True, metadata=_key("placementGroup"))
    """Put GPU nodes in a CLUSTER placement group (lowest latency for NCCL; requires a single subnet)."""

    gpu_subnet_count: int = field(default=1, metadata=_key("gpuSubnetCount"))
    """How many private subnets (AZs) the GPU nodes may use. Must be 1 with a placement group."""

    gpu_root_volume_gib: int = field(default=512, metadata=_key("gpuRootVolumeGiB"))
    """Encrypted gp3 root volume per GPU node, GiB (container images and local scratch)."""

    system_instance_type: str = field(default="m7i.xlarge", metadata=_key("systemInstanceType"))
    """EKS system node group instance type (controllers, CoreDNS, Trainer, device-plugin managers)."""

    head_node_instance_type: str = field(default="m7i.2xlarge", metadata=_key("headNodeInstanceType"))
    """ParallelCluster head node instance type (slurmctld)."""

    ssh_key_name: Optional[str] = field(default=None, metadata=_key("sshKeyName"))
    """Optional EC2 key pair for SSH to the ParallelCluster head node (SSM Session Manager works without)."""

    vpc_cidr: str = field(default="10.0.0.0/16", metadata=_key("vpcCidr"))
    """VPC CIDR block (/16 to /20); pods take VPC IPs with the EKS VPC CNI, so keep it large."""

    max_azs: int = field(default=2, metadata=_key("maxAzs"))
    """Availability zones for the VPC (2-3). The GPU nodes and FSx use the first one."""

    availability_zones: tuple[str, ...] = field(default=(), metadata=_key("availabilityZones"))
    """Optional explicit AZ names (JSON list or comma-separated); the first hosts GPU nodes and FSx. Pick the
    AZ where your GPU capacity is. Empty = the region's first ``maxAzs`` zones."""

    nat_gateways: int = field(default=1, metadata=_key("natGateways"))
    """NAT gateways (1 = cheapest; one per AZ for AZ-independent egress)."""

    fsx_storage_capacity_gib: int = field(default=1200, metadata=_key("fsxStorageCapacityGiB"))
    """FSx for Lustre PERSISTENT_2 SSD capacity in GiB: 1200, or a multiple of 2400."""

    fsx_throughput_per_tib: int = field(default=250, metadata=_key("fsxThroughputPerTiB"))
    """FSx PERSISTENT_2 throughput tier, MB/s per TiB: 125, 250, 500 or 1000."""

    bucket_name: Optional[str] = field(default=None, metadata=_key("bucketName"))
    """Existing S3 bucket to import for data and checkpoints. Unset = the stack creates an encrypted,
    versioned, SSL-only bucket (plus an access-log bucket)."""

    s3_prefix: str = field(default="", metadata=_key("s3Prefix"))
    """Key prefix in the bucket that FSx links to ``/fsx`` (``""`` = whole bucket; else must end with ``/``).
    Training data lives under ``<prefix>data/``; EKS jobs write ``<prefix>jobs/<name>/`` (checkpoints in its
    ``checkpoints/``), Slurm jobs ``<prefix>checkpoints/<name>/`` and ``<prefix>runs/<name>/``."""

    kubernetes_version: str = field(default="1.35", metadata=_key("kubernetesVersion", eks_only=True))
    """EKS Kubernetes version, pinned (1.34-1.36: the kubectl v1.35 layer's supported skew)."""

    trainer_chart_version: str = field(default="2.3.0", metadata=_key("trainerChartVersion", eks_only=True))
    """Kubeflow Trainer Helm chart version (v2.x; installs JobSet too). The runtime targets the 2.2+ API."""

    training_namespace: str = field(default=TRAINING_NAMESPACE, metadata=_key("trainingNamespace", eks_only=True))
    """Kubernetes namespace for TrainJobs, the FSx PVC and the S3 service account."""

    runtime_name: str = field(default=RUNTIME_NAME, metadata=_key("runtimeName", eks_only=True))
    """Name of the fault-tolerant ClusterTrainingRuntime the stack installs."""

    max_restarts: int = field(default=DEFAULT_MAX_RESTARTS, metadata=_key("maxRestarts", eks_only=True))
    """JobSet failurePolicy.maxRestarts: whole-job restarts (resume from the last checkpoint) before failing."""

    image_tag: str = field(default=DEFAULT_IMAGE_TAG, metadata=_key("imageTag", eks_only=True))
    """Tag (in the stack's ECR repository) of the runtime's default image, used only by TrainJobs that name no
    image: ``make train PLATFORM=eks`` names this checkout's image, the content tag ``make image`` pushes. Deploy
    with the tag ``make image`` printed to make that the default."""

    admin_role_arn: Optional[str] = field(default=None, metadata=_key("adminRoleArn", eks_only=True))
    """IAM role/user ARN granted EKS cluster-admin through an access entry (who runs kubectl / make train)."""

    api_allowed_cidrs: tuple[str, ...] = field(default=(), metadata=_key("apiAllowedCidrs", eks_only=True))
    """CIDRs allowed to reach the public EKS API endpoint (JSON list or comma-separated), e.g. your address
    ``203.0.113.7/32``. Unset or ``[]`` = private endpoint only (kubectl runs inside the VPC or through an SSM
    port forward: docs/deploy.md); ``make deploy PLATFORM=eks`` stops until you choose one of the two."""

    capacity_reservation_id: Optional[str] = field(default=None, metadata=_key("capacityReservationId"))
    """On-Demand Capacity Reservation or Capacity Block for ML (``cr-...``) the GPU nodes launch into (EKS launch
    template, ParallelCluster queue). It lives in one AZ: list that AZ first in ``availabilityZones`` (``make
    preflight`` does; ``make deploy`` requires it) and set ``placementGroup=false`` (a reservation carries its own
    placement)."""

    capacity_block: bool = field(default=False, metadata=_key("capacityBlock"))
    """``capacityReservationId`` is a Capacity Block for ML (market type ``capacity-block``): EKS node group capacity
    type ``CAPACITY_BLOCK``; ParallelCluster ``CapacityType: CAPACITY_BLOCK`` with ``gpuNodes`` static nodes."""

    capacity_block_start: Optional[str] = field(default=None, metadata=_key("capacityBlockStart"))
    """When the Capacity Block starts, UTC (ISO 8601, e.g. ``2026-12-01T11:30:00Z``); ``make preflight`` saves it from
    the reservation. Read by EKS only (ParallelCluster's static nodes wait for the block themselves), where
    ``make deploy`` needs it with ``capacityBlock``: the GPU node group holds 0 nodes (up to
    ``gpuNodes``) and a schedule scales it to ``gpuNodes`` at this time (a deploy during the block starts with
    ``gpuNodes``)."""

    capacity_block_end: Optional[str] = field(default=None, metadata=_key("capacityBlockEnd"))
    """When the Capacity Block ends, UTC (ISO 8601); ``make preflight`` saves it. A schedule scales the GPU node group
    to 0 40 minutes (``CAPACITY_BLOCK_DRAIN``) before it, so the nodes drain before EC2 reclaims them."""

    # ------------------------------------------------------------------ derived
    @property
    def gpu(self) -> GpuInstanceSpec:
        """Hardware facts of :attr:`gpu_instance_type`."""
        return GPU_INSTANCES[self.gpu_instance_type]

    @property
    def data_prefix(self) -> str:
        """S3 key prefix (and /fsx sub-directory) for training data."""
        return f"{self.s3_prefix}data/"

    @property
    def job_prefixes(self) -> tuple[str, ...]:
        """S3 key prefixes (and /fsx sub-directories) the platform's jobs write: on EKS ``jobs/`` (a TrainJob's
        ``/fsx/jobs/<name>``: checkpoints and metrics, cluster_assets/k8s/trainjob.py), on ParallelCluster
        ``checkpoints/`` and ``runs/`` (``<shared>/checkpoints/<name>``, ``<shared>/runs/<name>``,
        cluster_assets/slurm/config.py)."""
        dirs = EKS_JOB_DIRS if self.platform == "eks" else SLURM_JOB_DIRS
        return tuple(f"{self.s3_prefix}{d}/" for d in dirs)

    def stack_name(self, part: str) -> str:
        """CloudFormation stack name for ``part`` (network, storage, eks, pcluster)."""
        return f"{self.name_prefix}-{part}"

    @property
    def cluster_name(self) -> str:
        """EKS or ParallelCluster cluster name (must differ from every stack name)."""
        return f"{self.name_prefix}-{'gpu' if self.platform == 'eks' else 'slurm'}"

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        def bad(key: str, value: Any, fix: str) -> ConfigError:
            return ConfigError(f"context {key}={value!r}: {fix}")

        if self.platform not in PLATFORMS:
            raise bad("platform", self.platform, f"use one of {', '.join(PLATFORMS)}")
        if self.account is not None and not re.fullmatch(r"\d{12}", self.account):
            raise bad("account", self.account, "an AWS account id is 12 digits; unset it for env-agnostic stacks")
        if self.region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", self.region):
            raise bad("region", self.region, "expected a region name such as us-east-1")
        if not re.fullmatch(r"[a-z][a-z0-9-]{1,19}", self.name_prefix) or self.name_prefix.endswith("-"):
            raise bad(
                "namePrefix", self.name_prefix, "use 2-20 lowercase letters, digits or hyphens, starting with a letter"
            )
        try:
            gpu_instance(self.gpu_instance_type)
        except ValueError as e:
            raise ConfigError(f"context {e}") from None
        if self.gpu_nodes < 1:
            raise bad("gpuNodes", self.gpu_nodes, "need at least 1 GPU node (2+ for multi-node training)")
        if self.gpu_nodes > 64:
            raise bad(
                "gpuNodes",
                self.gpu_nodes,
                "at most 64 nodes per cluster placement group here; split into several node groups/queues for more",
            )
        if self.max_azs not in (2, 3):
            raise bad("maxAzs", self.max_azs, "use 2 or 3 (EKS needs subnets in at least 2 AZs)")
        if self.gpu_subnet_count < 1 or self.gpu_subnet_count > self.max_azs:
            raise bad("gpuSubnetCount", self.gpu_subnet_count, f"use 1..maxAzs ({self.max_azs})")
        if self.placement_group and self.gpu_subnet_count != 1:
            raise bad(
                "gpuSubnetCount",
                self.gpu_subnet_count,
                "a CLUSTER placement group lives in one AZ, so the GPU nodes must use exactly one subnet: "
                "set gpuSubnetCount=1, or placementGroup=false to spread GPU nodes over several AZs",
            )
        if not 100 <= self.gpu_root_volume_gib <= 16384:
            raise bad(
                "gpuRootVolumeGiB",
                self.gpu_root_volume_gib,
                "use 100-16384 GiB (the NVIDIA AMI plus the training image need ~100 GiB)",
            )
        for key, value in (
            ("systemInstanceType", self.system_instance_type),
            ("headNodeInstanceType", self.head_node_instance_type),
        ):
            known = ec2_instance_types()
            if not EC2_INSTANCE_TYPE.fullmatch(value) or (known and value not in known):
                raise bad(
                    key,
                    value,
                    "not an EC2 instance type"
                    + (f" (botocore {known.version} lists no such type)" if known else " (FAMILY.SIZE)")
                    + f"; pass an existing one, e.g. -c {key}=m7i.2xlarge (aws ec2 "
                    "describe-instance-types lists them)",
                )
        if self.head_node_instance_type in GPU_INSTANCES or self.system_instance_type in GPU_INSTANCES:
            raise ConfigError(
                "context systemInstanceType/headNodeInstanceType: use a general-purpose type "
                "(e.g. m7i.xlarge), not a GPU type; GPUs belong in gpuInstanceType"
            )
        if self.ssh_key_name is not None and not self.ssh_key_name.strip():
            raise bad("sshKeyName", self.ssh_key_name, "unset it or give an existing EC2 key pair name")
        try:
            net = ipaddress.ip_network(self.vpc_cidr)
        except ValueError:
            raise bad("vpcCidr", self.vpc_cidr, "expected an IPv4 CIDR such as 10.0.0.0/16") from None
        if net.version != 4 or not 16 <= net.prefixlen <= 20:
            raise bad("vpcCidr", self.vpc_cidr, "use an IPv4 block from /16 to /20")
        if self.nat_gateways < 1 or self.nat_gateways > self.max_azs:
            raise bad(
                "natGateways",
                self.nat_gateways,
                f"use 1..maxAzs ({self.max_azs}); private GPU nodes need NAT to pull images and charts",
            )
        if self.availability_zones:
            if len(self.availability_zones) != self.max_azs or len(set(self.availability_zones)) != self.max_azs:
                raise bad(
                    "availabilityZones",
                    list(self.availability_zones),
                    f"list exactly maxAzs ({self.max_azs}) distinct AZ names, or set maxAzs to match",
                )
            for az in self.availability_zones:
                if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d[a-z]", az):
                    raise bad("availabilityZones", az, "expected AZ names such as us-east-1a")
                if self.region and not az.startswith(self.region):
                    raise bad("availabilityZones", az, f"AZ is not in region {self.region}")
        self._validate_fsx(bad)
        if self.bucket_name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", self.bucket_name):
            raise bad(
                "bucketName",
                self.bucket_name,
                "not a valid S3 bucket name (3-63 lowercase letters, digits, dots, hyphens); "
                "unset it to let the stack create the bucket",
            )
        if self.s3_prefix and (
            not self.s3_prefix.endswith("/")
            or self.s3_prefix.startswith("/")
            or not re.fullmatch(r"[A-Za-z0-9!_.*'()/-]+", self.s3_prefix)
        ):
            raise bad("s3Prefix", self.s3_prefix, "use a key prefix like 'team/t5/' (no leading '/', trailing '/')")
        if self.kubernetes_version not in KUBERNETES_VERSIONS:
            raise bad(
                "kubernetesVersion",
                self.kubernetes_version,
                f"use one of {', '.join(KUBERNETES_VERSIONS)} (the pinned kubectl v1.35 layer manages "
                "clusters within one minor version)",
            )
        m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", self.trainer_chart_version)
        if not m or int(m.group(1)) != 2 or int(m.group(2)) < 2:
            raise bad(
                "trainerChartVersion",
                self.trainer_chart_version,
                "use a Kubeflow Trainer v2.x chart version >= 2.2.0, e.g. 2.3.0 (the runtime uses the "
                "2.2+ API; v2.1 manifests do not validate on 2.2+)",
            )
        for key, value in (("trainingNamespace", self.training_namespace), ("runtimeName", self.runtime_name)):
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
                raise bad(key, value, "must be a Kubernetes DNS-1123 label (lowercase alphanumerics and '-')")
        if self.training_namespace in ("kube-system", "kube-public", "default", "kubeflow-system"):
            raise bad("trainingNamespace", self.training_namespace, "use a dedicated namespace such as 'training'")
        if not 0 <= self.max_restarts <= 1000:
            raise bad("maxRestarts", self.max_restarts, "use 0-1000 whole-job restarts")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", self.image_tag):
            raise bad("imageTag", self.image_tag, "not a valid container image tag")
        if self.admin_role_arn is not None and not re.fullmatch(
            r"arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", self.admin_role_arn
        ):
            raise bad(
                "adminRoleArn",
                self.admin_role_arn,
                "expected an IAM role or user ARN such as arn:aws:iam::123456789012:role/Admin",
            )
        self._validate_capacity(bad)
        for cidr in self.api_allowed_cidrs:
            try:
                net = ipaddress.ip_network(cidr)
            except ValueError:
                raise bad("apiAllowedCidrs", cidr, "expected CIDRs such as 203.0.113.0/24") from None
            if net.version != 4:  # EKS refuses IPv6 CIDRs for an IPv4 cluster's endpoint, at deploy time
                raise bad(
                    "apiAllowedCidrs",
                    cidr,
                    "an IPv6 CIDR: the cluster is IPv4 and EKS accepts only IPv4 "
                    "CIDRs for its public endpoint (0.0.0.0/0 already means every address); pass IPv4 "
                    "CIDRs such as 203.0.113.0/24, or [] for a private endpoint only",
                )

    @property
    def capacity_block_window(self) -> Optional[tuple[datetime.datetime, datetime.datetime]]:
        """(start, end) of the Capacity Block, UTC, when both are set."""
        if self.capacity_block_start is None or self.capacity_block_end is None:
            return None
        return _utc(self.capacity_block_start), _utc(self.capacity_block_end)

    def _validate_capacity_block_window(self, bad: Callable[[str, Any, str], ConfigError]) -> None:
        for key, value in (
            ("capacityBlockStart", self.capacity_block_start),
            ("capacityBlockEnd", self.capacity_block_end),
        ):
            if value is not None and not self.capacity_block:
                raise bad(key, value, "only a Capacity Block has a window: set capacityBlock=true, or drop it")
            if value is not None:
                try:
                    _utc(value)
                except ValueError:
                    raise bad(key, value, "expected a UTC time such as 2026-12-01T11:30:00Z") from None
        if self.capacity_block_window is None:
            return  # make deploy requires it (stacks/deploy_config.py); a bare synth shows 0 nodes
        start, end = self.capacity_block_window
        if end - start <= CAPACITY_BLOCK_DRAIN:
            raise bad(
                "capacityBlockEnd",
                self.capacity_block_end,
                f"it must be more than {CAPACITY_BLOCK_DRAIN} after capacityBlockStart={self.capacity_block_start}",
            )

    def _validate_capacity(self, bad: Callable[[str, Any, str], ConfigError]) -> None:
        self._validate_capacity_block_window(bad)
        rid = self.capacity_reservation_id
        if rid is None:
            if self.capacity_block:
                raise bad(
                    "capacityBlock",
                    True,
                    "a Capacity Block is used through its reservation id: also set "
                    "capacityReservationId=cr-... (aws ec2 describe-capacity-reservations lists it)",
                )
            return
        if not CAPACITY_RESERVATION_ID.fullmatch(rid):
            raise bad("capacityReservationId", rid, "expected a capacity reservation id such as cr-0123456789abcdef0")
        if self.placement_group:
            raise bad(
                "placementGroup",
                True,
                f"capacityReservationId={rid}: a reservation carries its own placement "
                "and instances launched into a new placement group do not use it; set placementGroup=false",
            )

    def _validate_fsx(self, bad: Callable[[str, Any, str], ConfigError]) -> None:
        cap = self.fsx_storage_capacity_gib
        if cap != 1200 and (cap < 2400 or cap % 2400):
            lower = max(1200, cap // 2400 * 2400)
            raise bad(
                "fsxStorageCapacityGiB",
                cap,
                f"PERSISTENT_2 capacity is 1200 GiB or a multiple of 2400 GiB (e.g. {lower} or "
                f"{(cap // 2400 + 1) * 2400})",
            )
        if self.fsx_throughput_per_tib not in FSX_THROUGHPUT_TIERS:
            raise bad(
                "fsxThroughputPerTiB",
                self.fsx_throughput_per_tib,
                f"PERSISTENT_2 throughput tiers are {', '.join(map(str, FSX_THROUGHPUT_TIERS))} MB/s/TiB",
            )

    # ------------------------------------------------------------------ construction from context
    @classmethod
    def context_keys(cls) -> dict[str, str]:
        """Map of context key -> field name, for every field."""
        return {f.metadata["context_key"]: f.name for f in dataclasses.fields(cls)}

    @classmethod
    def eks_only_keys(cls) -> frozenset[str]:
        """The context keys that only the EKS stacks read (ParallelCluster deploys ignore them)."""
        return frozenset(f.metadata["context_key"] for f in dataclasses.fields(cls) if f.metadata["eks_only"])

    @classmethod
    def from_context(cls, get: Callable[[str], Any] | Mapping[str, Any]) -> "InfraConfig":
        """Build from CDK context: ``get`` is ``app.node.try_get_context`` or a plain mapping.

        Absent keys keep the dataclass defaults; strings from ``-c key=value`` are coerced to the field type.
        """
        lookup = get.get if isinstance(get, Mapping) else get
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = f.metadata["context_key"]
            raw = lookup(key)
            if raw is None:
                continue
            values[f.name] = _coerce(key, raw, hints[f.name])
        return cls(**values)

    @classmethod
    def unknown_keys(cls, context: Mapping[str, Any]) -> list[str]:
        """Context keys that are neither ours nor CDK's own (``stacks.context_keys``): typos, in any spelling."""
        return ctx_keys.unknown_keys(context, cls.context_keys())

    @classmethod
    def check_keys(cls, context: Mapping[str, Any]) -> None:
        """Raise :class:`ConfigError` naming every unknown key of ``context`` and the key it probably meant."""
        unknown = cls.unknown_keys(context)
        if unknown:
            raise ConfigError(ctx_keys.unknown_keys_message(unknown, cls.context_keys()))


def _coerce(key: str, raw: Any, hint: Any) -> Any:
    """Convert a context value (JSON from cdk.json, or a string from ``-c``) to the field's type."""
    text = raw.strip() if isinstance(raw, str) else raw
    if hint in (str, Optional[str]):
        if not isinstance(raw, str):
            raise ConfigError(f"context {key}={raw!r}: expected a string")
        return None if hint is Optional[str] and text == "" else raw
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(text, str) and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(f"context {key}={raw!r}: expected true or false")
    if hint is int:
        if isinstance(raw, bool):
            raise ConfigError(f"context {key}={raw!r}: expected an integer")
        if isinstance(raw, int):
            return raw
        if isinstance(text, str) and re.fullmatch(r"-?\d+", text):
            return int(text)
        raise ConfigError(f"context {key}={raw!r}: expected an integer")
    if hint == tuple[str, ...]:
        items = raw
        if isinstance(raw, str):
            if text.startswith("["):
                try:
                    items = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"context {key}={raw!r}: invalid JSON list ({e})") from None
            else:
                items = [p.strip() for p in text.split(",") if p.strip()]
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"context {key}={raw!r}: expected a list of strings (JSON or comma-separated)")
        return tuple(items)
    raise TypeError(f"no coercion for {key}: {hint}")  # programming error: a new field type


def field_docs() -> dict[str, str]:
    """Context key -> the field's docstring (read from this module's source, so docs live in one place)."""
    keys = {f.name: f.metadata["context_key"] for f in dataclasses.fields(InfraConfig)}
    return {keys[name]: doc for name, doc in _field_docs(InfraConfig).items()}


def defaults() -> dict[str, Any]:
    """Context key -> default value (JSON-friendly: tuples as lists), for every field."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(InfraConfig):
        value = f.default
        out[f.metadata["context_key"]] = list(value) if isinstance(value, tuple) else value
    return out
