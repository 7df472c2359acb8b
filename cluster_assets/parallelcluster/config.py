"""The AWS ParallelCluster 3 cluster configuration, produced by one pure function.

The ParallelCluster stack passes the returned dict (with CloudFormation tokens for subnet, file-system and
security-group IDs) to the ``Custom::PclusterCluster`` resource. Tests call the same function with
placeholder IDs and validate the result with the real ``aws-parallelcluster`` schema, which rejects unknown
keys and bad enums/IDs (it cannot parse tokens, hence the placeholders).

No CDK imports: importable from any venv.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from cluster_assets.parallelcluster.node_setup import NodeSetup
from cluster_facts import FSX_MOUNT_PATH, GPU_QUEUE


def build_cluster_config(
    *,
    head_node_instance_type: str,
    head_node_subnet_id: str,
    compute_subnet_ids: Sequence[str],
    gpu_instance_type: str,
    compute_resource_name: str,
    max_nodes: int,
    fsx_file_system_id: str,
    additional_security_group_ids: Sequence[str],
    bucket_name: str,
    efa: bool = True,
    placement_group: bool = True,
    min_nodes: int = 0,
    region: Optional[str] = None,
    ssh_key_name: Optional[str] = None,
    os: str = "alinux2023",
    head_node_root_gib: int = 100,
    compute_root_gib: int = 512,
    scaledown_idle_minutes: int = 10,
    tags: Optional[dict[str, str]] = None,
    node_setup: Optional[NodeSetup] = None,
    head_node_security_group_id: Optional[str] = None,
    compute_security_group_id: Optional[str] = None,
    node_iam_policy_arns: Sequence[str] = (),
    head_node_iam_policy_arns: Sequence[str] = (),
    s3_read_prefixes: Sequence[str] = ("data/",),
    s3_write_prefixes: Sequence[str] = ("checkpoints/", "runs/"),
    capacity_reservation_id: Optional[str] = None,
    capacity_block: bool = False,
) -> dict[str, Any]:
    """Render the cluster configuration (the YAML document ``pcluster create-cluster`` takes) as a dict.

    Args:
        head_node_instance_type: head node (slurmctld, login) instance type.
        head_node_subnet_id: subnet of the head node (private with NAT is fine; reach it with SSM).
        compute_subnet_ids: subnets of the GPU queue; exactly one with a placement group (it lives in one AZ).
        gpu_instance_type: compute instance type, e.g. ``p5.48xlarge``.
        compute_resource_name: Slurm compute-resource name (``[a-z][a-z0-9-]*``), e.g. ``p5-48xlarge``.
        max_nodes: MaxCount of the queue: the most GPU nodes a job can get.
        min_nodes: MinCount: nodes kept running when idle (0 = launch on demand, pay only while used).
        fsx_file_system_id: existing FSx for Lustre file system mounted at ``/fsx`` on every node.
        additional_security_group_ids: security groups added to head and compute nodes (the Lustre-client
            group that the file system's security group admits on ports 988 and 1018-1023).
        bucket_name: S3 bucket of the data and checkpoints (the nodes' direct access is limited to the prefixes).
        s3_read_prefixes: key prefixes of ``bucket_name`` the nodes may read (training data).
        s3_write_prefixes: key prefixes the nodes may read and write: where Slurm jobs put checkpoints and runs
            (``/fsx/checkpoints/<name>``, ``/fsx/runs/<name>``, exported by FSx under the same keys). Nothing else
            in the bucket is writable (ParallelCluster grants ``s3:*`` on each ``KeyName``'s objects only).
        capacity_reservation_id: an On-Demand Capacity Reservation or Capacity Block (``cr-...``) the GPU queue
            launches into (``CapacityReservationTarget``); its AZ must be the compute subnet's.
        capacity_block: the reservation is a Capacity Block for ML: ``CapacityType: CAPACITY_BLOCK`` and all
            ``max_nodes`` are static (ParallelCluster requires ``MinCount == MaxCount``; ``min_nodes`` is ignored).
        efa: enable EFA on the GPU compute resource.
        placement_group: put the GPU queue in a cluster placement group. Disable it when targeting a
            Capacity Block or AWS-provided ODCR, which carry their own placement.
        region: optional ``Region`` key (omitted = the region the provider stack runs in).
        ssh_key_name: optional EC2 key pair for SSH to the head node.
        os: ParallelCluster base OS.
        head_node_root_gib / compute_root_gib: encrypted root volume sizes.
        scaledown_idle_minutes: idle minutes before dynamic nodes are terminated.
        tags: extra tags for every cluster resource.
        node_setup: the uploaded node scripts (:class:`NodeSetup`): Pyxis/Enroot with ECR credentials on every
            node, the etcd coordinator's client side on the head node, and read access to exactly those
            objects. None = no custom actions (a bare cluster, e.g. to test the schema).
        head_node_security_group_id: security group added to the head node only: a source the etcd members'
            group admits on the client port. Required with ``node_setup``.
        compute_security_group_id: security group added to the GPU queue's nodes only: the other source the members'
            group admits. Required with ``node_setup``.
        node_iam_policy_arns: managed policies added to the head node and queue roles
            (``Iam.AdditionalIamPolicies``), e.g. ECR pull. Required with ``node_setup`` (Enroot's pulls).
            ParallelCluster's provider may attach only policies named ``parallelcluster*`` or under the IAM
            path ``/parallelcluster/``.
        head_node_iam_policy_arns: managed policies added to the head node's role only (the etcd client
            certificate, which the compute nodes get over the shared /home, and root's password, which stays
            root's on the head node: jobs get their own etcd users through its helper).
    """
    _check_queue_arguments(
        max_nodes=max_nodes,
        min_nodes=min_nodes,
        compute_subnet_ids=compute_subnet_ids,
        placement_group=placement_group,
        additional_security_group_ids=additional_security_group_ids,
    )
    _check_capacity_arguments(
        capacity_reservation_id=capacity_reservation_id,
        capacity_block=capacity_block,
        placement_group=placement_group,
        compute_subnet_ids=compute_subnet_ids,
    )
    _check_s3_prefixes(s3_read_prefixes, s3_write_prefixes)
    _check_node_setup_arguments(
        node_setup=node_setup,
        head_node_security_group_id=head_node_security_group_id,
        compute_security_group_id=compute_security_group_id,
        node_iam_policy_arns=node_iam_policy_arns,
    )

    head_security_groups, queue_security_groups = _security_groups(
        additional_security_group_ids=additional_security_group_ids,
        head_node_security_group_id=head_node_security_group_id,
        compute_security_group_id=compute_security_group_id,
    )
    head_iam, queue_iam = _node_iam(
        bucket_name=bucket_name,
        node_setup=node_setup,
        node_iam_policy_arns=node_iam_policy_arns,
        head_node_iam_policy_arns=head_node_iam_policy_arns,
        read_prefixes=s3_read_prefixes,
        write_prefixes=s3_write_prefixes,
    )

    config: dict[str, Any] = {
        "Image": {"Os": os},
        "HeadNode": _head_node(
            instance_type=head_node_instance_type,
            subnet_id=head_node_subnet_id,
            security_groups=head_security_groups,
            root_gib=head_node_root_gib,
            iam=head_iam,
            ssh_key_name=ssh_key_name,
            node_setup=node_setup,
            os=os,
        ),
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": {"ScaledownIdletime": scaledown_idle_minutes},
            "SlurmQueues": [
                _gpu_queue(
                    subnet_ids=compute_subnet_ids,
                    placement_group=placement_group,
                    security_groups=queue_security_groups,
                    compute_resource_name=compute_resource_name,
                    instance_type=gpu_instance_type,
                    min_nodes=min_nodes,
                    max_nodes=max_nodes,
                    efa=efa,
                    root_gib=compute_root_gib,
                    iam=queue_iam,
                    node_setup=node_setup,
                    os=os,
                    capacity_reservation_id=capacity_reservation_id,
                    capacity_block=capacity_block,
                )
            ],
        },
        "SharedStorage": [_fsx_storage(fsx_file_system_id)],
        # ParallelCluster retains the cluster's log group by default, which then bills storage after a destroy.
        "Monitoring": {"Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": 30, "DeletionPolicy": "Delete"}}},
    }
    if region:
        config["Region"] = region
    if tags:
        config["Tags"] = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    return config


def _check_queue_arguments(
    *,
    max_nodes: int,
    min_nodes: int,
    compute_subnet_ids: Sequence[str],
    placement_group: bool,
    additional_security_group_ids: Sequence[str],
) -> None:
    """Raise ValueError, naming the argument, when the GPU queue could not be created or mount the file system."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes={max_nodes}: the GPU queue needs at least 1 node")
    if not 0 <= min_nodes <= max_nodes:
        raise ValueError(f"min_nodes={min_nodes}: must be between 0 and max_nodes ({max_nodes})")
    if not compute_subnet_ids:
        raise ValueError("compute_subnet_ids: give the GPU queue at least one subnet")
    if placement_group and len(compute_subnet_ids) != 1:
        raise ValueError(
            f"compute_subnet_ids has {len(compute_subnet_ids)} subnets but placement_group=True: a "
            "cluster placement group lives in one AZ; pass one subnet or disable the placement group"
        )
    if not additional_security_group_ids:
        raise ValueError(
            "additional_security_group_ids: pass the Lustre client security group, or nodes "
            "cannot mount the file system"
        )


def _check_capacity_arguments(
    *,
    capacity_reservation_id: Optional[str],
    capacity_block: bool,
    placement_group: bool,
    compute_subnet_ids: Sequence[str],
) -> None:
    """Raise ValueError, naming the argument, when the queue could not launch into the reservation."""
    if capacity_block and not capacity_reservation_id:
        raise ValueError("capacity_block=True needs the Capacity Block's capacity_reservation_id (cr-...)")
    if capacity_reservation_id is None:
        return
    if not capacity_reservation_id.startswith("cr-"):
        raise ValueError(
            f"capacity_reservation_id={capacity_reservation_id!r}: expected an id such as cr-0123456789abcdef0"
        )
    if placement_group:
        raise ValueError(
            "capacity_reservation_id with placement_group=True: a reservation carries its own placement; "
            "pass placement_group=False"
        )
    if len(compute_subnet_ids) != 1:
        raise ValueError(
            f"capacity_reservation_id with {len(compute_subnet_ids)} compute subnets: a reservation lives "
            "in one AZ; pass only that AZ's subnet"
        )


def _check_s3_prefixes(read_prefixes: Sequence[str], write_prefixes: Sequence[str]) -> None:
    """Raise ValueError for a prefix that would widen the grant: empty (= the whole bucket) or not ending in '/'."""
    for prefix in (*read_prefixes, *write_prefixes):
        if not prefix or not prefix.endswith("/") or prefix.startswith("/") or "*" in prefix:
            raise ValueError(
                f"S3 prefix {prefix!r}: expected a key prefix such as 'checkpoints/' (no '*', leading "
                "'/' or empty prefix: that would grant the whole bucket)"
            )


def _check_node_setup_arguments(
    *,
    node_setup: Optional[NodeSetup],
    head_node_security_group_id: Optional[str],
    compute_security_group_id: Optional[str],
    node_iam_policy_arns: Sequence[str],
) -> None:
    """Raise ValueError, naming the argument, when the node scripts would lack what they need: the nodes'
    two security groups (both or neither, never blank) and the ECR pull policy (no blank ARN)."""
    if (head_node_security_group_id is None) != (compute_security_group_id is None):
        raise ValueError(
            "head_node_security_group_id and compute_security_group_id go together: the etcd members' "
            "group admits both; pass both or neither"
        )
    if node_setup is not None:
        if head_node_security_group_id is None:
            raise ValueError(
                "node_setup points the nodes at the etcd members, but no head_node_security_group_id/"
                "compute_security_group_id were given: the members' group could not admit them; pass "
                "both security groups"
            )
        if not node_iam_policy_arns:
            raise ValueError(
                "node_setup gives Enroot ECR credentials, but node_iam_policy_arns is empty: pass "
                "the ECR pull policy, or every image pull is denied"
            )
    for name, value in (
        ("head_node_security_group_id", head_node_security_group_id),
        ("compute_security_group_id", compute_security_group_id),
    ):
        if value is not None and not value.strip():
            raise ValueError(f"{name} is empty: pass the security group id (sg-...) the stack created")
    for arn in node_iam_policy_arns:  # (head_node_iam_policy_arns are checked by the schema)
        if not arn.strip():
            raise ValueError("node_iam_policy_arns has an empty entry: pass managed policy ARNs")


def _security_groups(
    *,
    additional_security_group_ids: Sequence[str],
    head_node_security_group_id: Optional[str],
    compute_security_group_id: Optional[str],
) -> tuple[list[str], list[str]]:
    """The additional security groups of the head node and of the GPU queue, in that order: the shared ones,
    plus the head node's group on the head node and the compute group on the queue when they are given."""
    head_security_groups = list(additional_security_group_ids)
    queue_security_groups = list(additional_security_group_ids)
    if head_node_security_group_id is not None and compute_security_group_id is not None:
        head_security_groups.append(head_node_security_group_id)
        queue_security_groups.append(compute_security_group_id)
    return head_security_groups, queue_security_groups


def _node_iam(
    *,
    bucket_name: str,
    node_setup: Optional[NodeSetup],
    node_iam_policy_arns: Sequence[str],
    head_node_iam_policy_arns: Sequence[str],
    read_prefixes: Sequence[str],
    write_prefixes: Sequence[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``Iam`` sections of the head node and of the GPU queue, in that order: read access to the data
    prefixes and read-write access to the jobs' prefixes of the bucket (least privilege, as the EKS pods get),
    read access to the node scripts each runs, and the extra managed policies."""
    s3_access: list[dict[str, Any]] = [
        {"BucketName": bucket_name, "KeyName": f"{p}*", "EnableWriteAccess": False} for p in read_prefixes
    ] + [{"BucketName": bucket_name, "KeyName": f"{p}*", "EnableWriteAccess": True} for p in write_prefixes]
    head_iam: dict[str, Any] = {"S3Access": s3_access + (node_setup.head_node_s3_access() if node_setup else [])}
    queue_iam: dict[str, Any] = {"S3Access": s3_access + (node_setup.queue_s3_access() if node_setup else [])}
    if node_iam_policy_arns or head_node_iam_policy_arns:
        head_iam["AdditionalIamPolicies"] = [
            {"Policy": arn} for arn in (*node_iam_policy_arns, *head_node_iam_policy_arns)
        ]
    if node_iam_policy_arns:
        queue_iam["AdditionalIamPolicies"] = [{"Policy": arn} for arn in node_iam_policy_arns]
    return head_iam, queue_iam


def _head_node(
    *,
    instance_type: str,
    subnet_id: str,
    security_groups: list[str],
    root_gib: int,
    iam: dict[str, Any],
    ssh_key_name: Optional[str],
    node_setup: Optional[NodeSetup],
    os: str,
) -> dict[str, Any]:
    """The ``HeadNode`` section: slurmctld and the login node, with the etcd client side if ``node_setup``."""
    head_node: dict[str, Any] = {
        "InstanceType": instance_type,
        "Networking": {
            "SubnetId": subnet_id,
            "AdditionalSecurityGroups": security_groups,
        },
        "LocalStorage": {"RootVolume": {"Size": root_gib, "Encrypted": True}},
        # IMDSv2 is always required by ParallelCluster 3; Secured also blocks non-root users from IMDS.
        "Imds": {"Secured": True},
        "Iam": iam,
    }
    if ssh_key_name:
        head_node["Ssh"] = {"KeyName": ssh_key_name}
    if node_setup is not None:
        head_node["CustomActions"] = node_setup.head_node_custom_actions(os)
    return head_node


def _gpu_queue(
    *,
    subnet_ids: Sequence[str],
    placement_group: bool,
    security_groups: list[str],
    compute_resource_name: str,
    instance_type: str,
    min_nodes: int,
    max_nodes: int,
    efa: bool,
    root_gib: int,
    iam: dict[str, Any],
    node_setup: Optional[NodeSetup],
    os: str,
    capacity_reservation_id: Optional[str] = None,
    capacity_block: bool = False,
) -> dict[str, Any]:
    """The one entry of ``Scheduling.SlurmQueues``: the GPU queue (whole nodes per job, GPU health check), launched
    into ``capacity_reservation_id`` when given (a Capacity Block: static nodes only)."""
    if capacity_block:
        min_nodes = max_nodes  # ParallelCluster: a Capacity Block queue's nodes are all static
    queue: dict[str, Any] = {
        "Name": GPU_QUEUE,
        "CapacityType": "CAPACITY_BLOCK" if capacity_block else "ONDEMAND",
        "Networking": {
            "SubnetIds": list(subnet_ids),
            "PlacementGroup": {"Enabled": placement_group},
            "AdditionalSecurityGroups": security_groups,
        },
        "ComputeResources": [
            {
                "Name": compute_resource_name,
                "InstanceType": instance_type,
                "MinCount": min_nodes,
                "MaxCount": max_nodes,
                "Efa": {"Enabled": efa},
                **(
                    {"CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}}
                    if capacity_reservation_id
                    else {}
                ),
            }
        ],
        "ComputeSettings": {
            "LocalStorage": {"RootVolume": {"Size": root_gib, "Encrypted": True}},
        },
        # Whole nodes per job: one torchrun agent per node, all 8 GPUs.
        "JobExclusiveAllocation": True,
        # Run the GPU health check before a job starts on a node; a failing node is drained and replaced
        # instead of crashing the job again after every restart.
        "HealthChecks": {"Gpu": {"Enabled": True}},
        "Iam": iam,
    }
    if node_setup is not None:
        queue["CustomActions"] = node_setup.queue_custom_actions(os)
    return queue


def _fsx_storage(fsx_file_system_id: str) -> dict[str, Any]:
    """The one entry of ``SharedStorage``: the existing FSx for Lustre file system, mounted on every node."""
    return {
        "Name": "fsx",
        "StorageType": "FsxLustre",
        "MountDir": FSX_MOUNT_PATH,
        "FsxLustreSettings": {"FileSystemId": fsx_file_system_id},
    }
