"""The scripts ParallelCluster runs on the cluster's nodes, and the custom actions that run them.

* ``pyxis_enroot.sh``: enables Pyxis and Enroot (pre-installed, disabled on ParallelCluster 3.11.1+ AMIs) and
  gives Enroot ECR credentials; on the head node (``OnNodeConfigured``, also enables the plugstack) and on
  the compute nodes (``OnNodeStart``, before slurmd accepts jobs, as the AWS guide does).
* ``node_base.sh``: Python >= 3.11 on every node (the venv on /fsx links to it; Amazon Linux 2023's python3 is
  3.9) and, on the head node, the shared directories users write (``/fsx/checkpoints``, ``/fsx/runs``,
  ``/fsx/users/<user>``, ``/fsx/t5-failover``); first on each node (head ``OnNodeConfigured``, compute
  ``OnNodeStart``).
* ``etcd_client.sh``: the head node's side of the etcd coordinator (``stacks/components/etcd_members.py``): the
  client certificate and root's password from Secrets Manager into the cluster user's home directory (shared with
  the compute nodes), authentication turned on once, and ``/etc/t5-failover/etcd.env`` for the batch script
  (head node ``OnNodeConfigured``).

The stack uploads each script as an S3 asset; :class:`NodeSetup` takes their bucket and keys and renders the
``CustomActions`` blocks and the least-privilege ``S3Access`` entries (read on those objects only) that
:func:`cluster_assets.parallelcluster.config.build_cluster_config` puts into the cluster configuration.

No CDK imports: CloudFormation tokens (``${Token[...]}``) are accepted wherever a value is only known at deploy
time, and checked only when they are plain values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_facts import FSX_MOUNT_PATH

SCRIPT_DIR = Path(__file__).resolve().parent
PYXIS_ENROOT_SCRIPT = SCRIPT_DIR / "pyxis_enroot.sh"
ETCD_CLIENT_SCRIPT = SCRIPT_DIR / "etcd_client.sh"
NODE_BASE_SCRIPT = SCRIPT_DIR / "node_base.sh"
SCRIPTS = (NODE_BASE_SCRIPT, PYXIS_ENROOT_SCRIPT, ETCD_CLIENT_SCRIPT)

#: The default user of each ParallelCluster OS (``Image.Os``): the same uid on every node of the cluster.
CLUSTER_USERS = {
    "alinux2023": "ec2-user",
    "alinux2": "ec2-user",
    "rhel8": "ec2-user",
    "rhel9": "ec2-user",
    "rocky8": "rocky",
    "rocky9": "rocky",
    "ubuntu2004": "ubuntu",
    "ubuntu2204": "ubuntu",
    "ubuntu2404": "ubuntu",
}

_ECR_REGISTRY = re.compile(r"\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
_ENDPOINT = re.compile(r"https://\d{1,3}(\.\d{1,3}){3}:\d{1,5}")


def _is_token(value: str) -> bool:
    """True for a CDK token (resolved at deploy time): its format cannot be checked here."""
    return "${Token[" in value


@dataclass(frozen=True)
class NodeSetup:
    """The uploaded node scripts and their arguments.

    Attributes:
        script_bucket: S3 bucket holding the scripts (the CDK asset bucket).
        pyxis_enroot_script_key / etcd_client_script_key / node_base_script_key: object keys of
            ``pyxis_enroot.sh`` / ``etcd_client.sh`` / ``node_base.sh``.
        ecr_registry: ``<account>.dkr.ecr.<region>.amazonaws.com``, the registry Enroot gets credentials for.
        region: region of that registry and of the etcd secrets.
        etcd_endpoints: the etcd members' client URLs, comma separated (``https://IP:2379,...``).
        etcd_client_secret / etcd_root_secret: ARNs of the secrets with the client certificate and root's password.
    """

    script_bucket: str
    pyxis_enroot_script_key: str
    etcd_client_script_key: str
    node_base_script_key: str
    ecr_registry: str
    region: str
    etcd_endpoints: str
    etcd_client_secret: str
    etcd_root_secret: str

    def __post_init__(self) -> None:
        for name in (
            "script_bucket",
            "pyxis_enroot_script_key",
            "etcd_client_script_key",
            "node_base_script_key",
            "ecr_registry",
            "region",
            "etcd_endpoints",
            "etcd_client_secret",
            "etcd_root_secret",
        ):
            if not str(getattr(self, name)).strip():
                raise ValueError(
                    f"node_setup.{name} is empty: pass the stack's value (the S3 asset of "
                    f"cluster_assets/parallelcluster/node_setup/*.sh, the ECR repository's registry "
                    f"and region, the etcd members' endpoints and secrets)"
                )
        for name in ("pyxis_enroot_script_key", "etcd_client_script_key", "node_base_script_key"):
            key = getattr(self, name)
            if not _is_token(key) and (key.startswith("/") or not key.endswith(".sh")):
                raise ValueError(
                    f"node_setup.{name}={key!r}: expected the S3 object key of the uploaded .sh "
                    f"script, without a leading '/'"
                )
        if not _is_token(self.ecr_registry) and not _ECR_REGISTRY.fullmatch(self.ecr_registry):
            raise ValueError(
                f"node_setup.ecr_registry={self.ecr_registry!r}: expected "
                f"<account>.dkr.ecr.<region>.amazonaws.com (the host part of the repository URI)"
            )
        if not _is_token(self.region) and not _REGION.fullmatch(self.region):
            raise ValueError(f"node_setup.region={self.region!r}: expected a region name such as us-east-1")
        if not _is_token(self.etcd_endpoints):
            for endpoint in self.etcd_endpoints.split(","):
                if not _ENDPOINT.fullmatch(endpoint):
                    raise ValueError(
                        f"node_setup.etcd_endpoints={self.etcd_endpoints!r}: {endpoint!r} is not "
                        f"https://<IPv4>:<port> (e.g. https://10.0.1.10:2379,https://10.0.2.10:2379,...)"
                    )
        for name in ("etcd_client_secret", "etcd_root_secret"):
            value = getattr(self, name)
            if not _is_token(value) and not value.startswith("arn:"):
                raise ValueError(f"node_setup.{name}={value!r}: expected the secret's ARN (arn:aws:secretsmanager:...)")

    def url(self, key: str) -> str:
        """``s3://`` URL of one uploaded script."""
        return f"s3://{self.script_bucket}/{key}"

    def _pyxis_action(self, role: str) -> dict[str, Any]:
        return {"Script": self.url(self.pyxis_enroot_script_key), "Args": [role, self.ecr_registry, self.region]}

    @staticmethod
    def _user(os: str) -> str:
        if os not in CLUSTER_USERS:
            raise ValueError(f"os={os!r}: no known default user; use one of {', '.join(sorted(CLUSTER_USERS))}")
        return CLUSTER_USERS[os]

    def _base_action(self, role: str, os: str) -> dict[str, Any]:
        return {"Script": self.url(self.node_base_script_key), "Args": [role, self._user(os), FSX_MOUNT_PATH]}

    def head_node_custom_actions(self, os: str = "alinux2023") -> dict[str, Any]:
        """``HeadNode.CustomActions``: Python and the shared directories, Pyxis/Enroot, then the etcd client side
        (credentials, authentication, ``/etc/t5-failover/etcd.env``), once the node is configured."""
        etcd = {
            "Script": self.url(self.etcd_client_script_key),
            "Args": [self.etcd_endpoints, self.etcd_client_secret, self.etcd_root_secret, self.region, self._user(os)],
        }
        return {"OnNodeConfigured": {"Sequence": [self._base_action("head", os), self._pyxis_action("head"), etcd]}}

    def queue_custom_actions(self, os: str = "alinux2023") -> dict[str, Any]:
        """``SlurmQueues[].CustomActions``: Python and Pyxis/Enroot before the node's slurmd takes jobs."""
        return {"OnNodeStart": {"Sequence": [self._base_action("compute", os), self._pyxis_action("compute")]}}

    def head_node_s3_access(self) -> list[dict[str, Any]]:
        """Read access to exactly the three scripts the head node runs."""
        return [
            {"BucketName": self.script_bucket, "KeyName": key, "EnableWriteAccess": False}
            for key in (self.node_base_script_key, self.pyxis_enroot_script_key, self.etcd_client_script_key)
        ]

    def queue_s3_access(self) -> list[dict[str, Any]]:
        """Read access to exactly the two scripts the compute nodes run."""
        return [
            {"BucketName": self.script_bucket, "KeyName": key, "EnableWriteAccess": False}
            for key in (self.node_base_script_key, self.pyxis_enroot_script_key)
        ]
