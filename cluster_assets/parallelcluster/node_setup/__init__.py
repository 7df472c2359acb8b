"""The scripts ParallelCluster runs on the cluster's nodes, and the custom actions that run them.

* ``pyxis_enroot.sh``: enables Pyxis and Enroot (pre-installed, disabled on ParallelCluster 3.11.1+ AMIs) and
  gives Enroot ECR credentials; on the head node (``OnNodeConfigured``, also enables the plugstack) and on
  the compute nodes (``OnNodeStart``, before slurmd accepts jobs, as the AWS guide does).
* ``node_base.sh``: Python >= 3.11 on every node (the venv on /fsx links to it; Amazon Linux 2023's python3 is
  3.9) and, on the head node, the shared directories users write (``/fsx/checkpoints``, ``/fsx/runs``,
  ``/fsx/users/<user>``, ``/fsx/t5-failover``); first on each node (head ``OnNodeConfigured``, compute
  ``OnNodeStart``).
* ``rdzv_store.sh``: installs the systemd unit :data:`cluster_facts.RDZV_STORE_UNIT` that keeps
  ``python -m training.rdzv_store`` running on the head node's private address (head node ``OnNodeConfigured``).

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

from cluster_facts import FSX_MOUNT_PATH, RDZV_STORE_PORT, RDZV_STORE_UNIT

SCRIPT_DIR = Path(__file__).resolve().parent
PYXIS_ENROOT_SCRIPT = SCRIPT_DIR / "pyxis_enroot.sh"
RDZV_STORE_SCRIPT = SCRIPT_DIR / "rdzv_store.sh"
NODE_BASE_SCRIPT = SCRIPT_DIR / "node_base.sh"
SCRIPTS = (NODE_BASE_SCRIPT, PYXIS_ENROOT_SCRIPT, RDZV_STORE_SCRIPT)
RDZV_STORE_CHECKOUT_SCRIPT = SCRIPT_DIR / "rdzv_store_checkout.sh"
"""Run by hand on the head node (not uploaded): points the store at another checkout."""

#: The default user of each ParallelCluster OS (``Image.Os``): the same uid on every node of the cluster.
CLUSTER_USERS = {"alinux2023": "ec2-user", "alinux2": "ec2-user", "rhel8": "ec2-user", "rhel9": "ec2-user",
                 "rocky8": "rocky", "rocky9": "rocky", "ubuntu2004": "ubuntu", "ubuntu2204": "ubuntu",
                 "ubuntu2404": "ubuntu"}

DEFAULT_STORE_WORKDIR = f"{FSX_MOUNT_PATH}/t5-failover"
"""Where docs/slurm.md clones the repository on the cluster (``cd /fsx && git clone <repo> t5-failover``)."""
DEFAULT_STORE_PYTHON = f"{DEFAULT_STORE_WORKDIR}/.venv/bin/python"
"""The venv ``scripts/venv.sh`` creates in that checkout (CPU torch: enough for the store)."""

_ECR_REGISTRY = re.compile(r"\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
_UNIT = re.compile(r"[A-Za-z0-9_.@-]+\.service")
# rdzv_store.sh writes these paths unquoted into the unit file (see its own check).
_UNIT_PATH = re.compile(r"/[^\s%\"'\\]*")


def _is_token(value: str) -> bool:
    """True for a CDK token (resolved at deploy time): its format cannot be checked here."""
    return "${Token[" in value


@dataclass(frozen=True)
class NodeSetup:
    """The uploaded node scripts and their arguments.

    Attributes:
        script_bucket: S3 bucket holding both scripts (the CDK asset bucket).
        pyxis_enroot_script_key / rdzv_store_script_key / node_base_script_key: object keys of
            ``pyxis_enroot.sh`` / ``rdzv_store.sh`` / ``node_base.sh``.
        ecr_registry: ``<account>.dkr.ecr.<region>.amazonaws.com``, the registry Enroot gets credentials for.
        region: region of that registry (``aws ecr get-login-password --region``).
        store_port / store_unit: the store's TCP port and systemd unit (the shared :mod:`cluster_facts` names).
        store_python / store_workdir: the interpreter and checkout the unit runs the store from.
    """

    script_bucket: str
    pyxis_enroot_script_key: str
    rdzv_store_script_key: str
    node_base_script_key: str
    ecr_registry: str
    region: str
    store_port: int = RDZV_STORE_PORT
    store_unit: str = RDZV_STORE_UNIT
    store_python: str = DEFAULT_STORE_PYTHON
    store_workdir: str = DEFAULT_STORE_WORKDIR

    def __post_init__(self) -> None:
        for name in ("script_bucket", "pyxis_enroot_script_key", "rdzv_store_script_key", "node_base_script_key",
                     "ecr_registry", "region"):
            if not str(getattr(self, name)).strip():
                raise ValueError(f"node_setup.{name} is empty: pass the stack's value (the S3 asset of "
                                 f"cluster_assets/parallelcluster/node_setup/*.sh, the ECR repository's registry "
                                 f"and region)")
        for name in ("pyxis_enroot_script_key", "rdzv_store_script_key", "node_base_script_key"):
            key = getattr(self, name)
            if not _is_token(key) and (key.startswith("/") or not key.endswith(".sh")):
                raise ValueError(f"node_setup.{name}={key!r}: expected the S3 object key of the uploaded .sh "
                                 f"script, without a leading '/'")
        if not _is_token(self.ecr_registry) and not _ECR_REGISTRY.fullmatch(self.ecr_registry):
            raise ValueError(f"node_setup.ecr_registry={self.ecr_registry!r}: expected "
                             f"<account>.dkr.ecr.<region>.amazonaws.com (the host part of the repository URI)")
        if not _is_token(self.region) and not _REGION.fullmatch(self.region):
            raise ValueError(f"node_setup.region={self.region!r}: expected a region name such as us-east-1")
        if not 1 <= self.store_port <= 65535:
            raise ValueError(f"node_setup.store_port={self.store_port}: use a TCP port 1-65535 "
                             f"(default {RDZV_STORE_PORT})")
        if not _UNIT.fullmatch(self.store_unit):
            raise ValueError(f"node_setup.store_unit={self.store_unit!r}: expected a systemd service name such as "
                             f"{RDZV_STORE_UNIT}")
        for name in ("store_python", "store_workdir"):
            if not _UNIT_PATH.fullmatch(getattr(self, name)):
                raise ValueError(f"node_setup.{name}={getattr(self, name)!r}: use an absolute path without spaces, "
                                 f"quotes, backslashes or '%' (it goes into the systemd unit)")
        if not self.store_python.startswith(self.store_workdir.rstrip("/") + "/"):
            raise ValueError(f"node_setup.store_python={self.store_python!r} is outside store_workdir="
                             f"{self.store_workdir!r}: use the venv of that checkout, so the store runs the "
                             f"checkout's code with its own torch")

    def url(self, key: str) -> str:
        """``s3://`` URL of one uploaded script."""
        return f"s3://{self.script_bucket}/{key}"

    def _pyxis_action(self, role: str) -> dict[str, Any]:
        return {"Script": self.url(self.pyxis_enroot_script_key), "Args": [role, self.ecr_registry, self.region]}

    def _base_action(self, role: str, os: str) -> dict[str, Any]:
        if os not in CLUSTER_USERS:
            raise ValueError(f"os={os!r}: no known default user; use one of {', '.join(sorted(CLUSTER_USERS))}")
        return {"Script": self.url(self.node_base_script_key), "Args": [role, CLUSTER_USERS[os], FSX_MOUNT_PATH]}

    def head_node_custom_actions(self, os: str = "alinux2023") -> dict[str, Any]:
        """``HeadNode.CustomActions``: Python and the shared directories, Pyxis/Enroot, then the store's systemd
        unit, once the node is configured (FSx mounted)."""
        store = {"Script": self.url(self.rdzv_store_script_key),
                 "Args": [str(self.store_port), self.store_unit, self.store_python, self.store_workdir]}
        return {"OnNodeConfigured": {"Sequence": [self._base_action("head", os), self._pyxis_action("head"), store]}}

    def queue_custom_actions(self, os: str = "alinux2023") -> dict[str, Any]:
        """``SlurmQueues[].CustomActions``: Python and Pyxis/Enroot before the node's slurmd takes jobs."""
        return {"OnNodeStart": {"Sequence": [self._base_action("compute", os), self._pyxis_action("compute")]}}

    def head_node_s3_access(self) -> list[dict[str, Any]]:
        """Read access to exactly the three scripts the head node runs."""
        return [{"BucketName": self.script_bucket, "KeyName": key, "EnableWriteAccess": False}
                for key in (self.node_base_script_key, self.pyxis_enroot_script_key, self.rdzv_store_script_key)]

    def queue_s3_access(self) -> list[dict[str, Any]]:
        """Read access to exactly the two scripts the compute nodes run."""
        return [{"BucketName": self.script_bucket, "KeyName": key, "EnableWriteAccess": False}
                for key in (self.node_base_script_key, self.pyxis_enroot_script_key)]
