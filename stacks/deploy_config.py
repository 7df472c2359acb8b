"""The saved deploy configuration: the settings a deploy was given, kept for the next deploy.

``make deploy PLATFORM=... ARGS="-c key=value ..."`` merges its ``-c`` values into ``cdk.context.json`` (CDK's own
persisted-context file, which the CDK CLI reads on every ``synth``/``deploy``/``destroy``, ``npx cdk`` included) and
deploys from it. A later deploy that passes one new value (``-c imageTag=src-...``) keeps every other saved one:
``adminRoleArn``, ``gpuNodes``, ``apiAllowedCidrs`` and the AZ ``make preflight`` chose. Edit the file by hand, or
pass ``-c key=`` (empty) to drop a saved optional key. ``platform`` is never saved: ``PLATFORM`` names it.

Before anything is saved the merged settings are checked as synth checks them (unknown keys, bad values: exit 2),
and an EKS deploy must name two choices that have no safe default:

* ``apiAllowedCidrs``: who may reach the Kubernetes API (your address, e.g. ``203.0.113.7/32``), or ``[]`` for a
  private endpoint reached from inside the VPC (docs/deploy.md, "From a laptop to make train");
* ``adminRoleArn``: the IAM principal kubectl and ``make train PLATFORM=eks`` run as; without it nobody could.

    python -m stacks.deploy_config deploy PLATFORM [--dry-run] [CDK ARGS...]   # check, save, print a summary
    python -m stacks.deploy_config show PLATFORM                              # the saved settings and stacks
    python -m stacks.deploy_config storage                                    # storage stack and region (make image)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, get_type_hints

from stacks.config import ConfigError, InfraConfig, _coerce
from stacks.synth_check import ROOT, context_args

SAVED_FILE = "cdk.context.json"
#: Keys an EKS deploy must have saved or given, with what to pass: each is a choice with no safe default.
EKS_REQUIRED = {
    "apiAllowedCidrs": "who may reach the Kubernetes API: -c apiAllowedCidrs=<your address>/32 (curl -s "
    "https://checkip.amazonaws.com), or -c apiAllowedCidrs=[] for a private endpoint reached "
    'through the VPC (docs/deploy.md, "From a laptop to make train")',
    "adminRoleArn": "the IAM role kubectl and make train run as, e.g. -c adminRoleArn=$(aws sts get-caller-identity "
    "--query Arn --output text) for a role or user (an assumed-role ARN: pass its role's ARN)",
}


@dataclass(frozen=True)
class DeployPlan:
    """What a deploy will use: the validated config, the settings to save, and which of them this call changed."""

    config: InfraConfig
    saved: dict[str, Any]
    changed: dict[str, Any]


def saved_path(root: Path = ROOT) -> Path:
    return root / SAVED_FILE


def load_saved(root: Path = ROOT) -> dict[str, Any]:
    """The saved settings (``cdk.context.json``; CDK's cached lookups included), {} when there are none."""
    path = saved_path(root)
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: not valid JSON ({e}); fix or delete it (it holds the saved deploy settings)"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a JSON object of context keys, got {type(saved).__name__}")
    return saved


def saveable(key: str, raw: str) -> Any:
    """A ``-c key=value`` string as the JSON value to save (typed like cdk.json's), None for an empty optional."""
    names = InfraConfig.context_keys()
    hint = get_type_hints(InfraConfig)[names[key]]
    value = _coerce(key, raw, hint)
    return list(value) if isinstance(value, tuple) else value


def merge_settings(platform: str, argv: Sequence[str], root: Path = ROOT, *, command: str = "deploy") -> DeployPlan:
    """The saved settings with the ``-c`` values of ``argv`` merged in, checked as synth checks them (unknown keys,
    bad values and combinations raise ConfigError); nothing is written."""
    given = context_args(argv)
    if "platform" in given and given["platform"] != platform:
        raise ConfigError(
            f"-c platform={given['platform']} disagrees with PLATFORM={platform}: run "
            f"`make {command} PLATFORM={given['platform']}` without -c platform"
        )
    given.pop("platform", None)
    InfraConfig.check_keys(given)
    saved = load_saved(root)
    saved.pop("platform", None)
    changed: dict[str, Any] = {}
    for key, raw in given.items():
        value = saveable(key, raw)
        if value is None:
            saved.pop(key, None)
        else:
            saved[key] = value
        changed[key] = value
    cdk_json = json.loads((root / "cdk.json").read_text()).get("context", {})
    context = {**cdk_json, **saved, "platform": platform}
    InfraConfig.check_keys(context)
    return DeployPlan(config=InfraConfig.from_context(context), saved=saved, changed=changed)


def plan_deploy(platform: str, argv: Sequence[str], root: Path = ROOT) -> DeployPlan:
    """:func:`merge_settings` plus what only a deploy needs: the EKS choices without a safe default, and the AZ
    of a capacity reservation. Raises ConfigError naming the key and what to pass."""
    plan = merge_settings(platform, argv, root)
    if platform == "eks":
        for key, fix in EKS_REQUIRED.items():
            if key not in plan.saved:
                raise ConfigError(f"{key} is not set (neither saved in {SAVED_FILE} nor given): pass {fix}")
    cfg = plan.config
    if cfg.capacity_reservation_id and not cfg.availability_zones:
        raise ConfigError(
            f"capacityReservationId={cfg.capacity_reservation_id} lives in one AZ and the GPU nodes "
            "must launch there, but availabilityZones is not set: run `make preflight "
            f"PLATFORM={platform}` (it finds the reservation's AZ and saves it), or pass "
            "-c availabilityZones=<its AZ>,<another AZ>"
        )
    if platform == "eks" and cfg.capacity_block and cfg.capacity_block_window is None:
        raise ConfigError(
            "capacityBlock=true on EKS needs the block's window (the GPU node group scales up at its start and to 0 "
            "before its end): run `make preflight PLATFORM=eks` (it saves capacityBlockStart and capacityBlockEnd "
            "from the reservation), or pass -c capacityBlockStart=<UTC start> -c capacityBlockEnd=<UTC end>"
        )
    return plan


def save(saved: Mapping[str, Any], root: Path = ROOT) -> Path:
    path = saved_path(root)
    path.write_text(json.dumps(dict(saved), indent=2) + "\n")
    return path


def settings_line(saved: Mapping[str, Any], platform: str) -> str:
    """The saved settings of ours (not CDK's cached lookups), as key=value pairs; on ParallelCluster the EKS-only
    ones (one settings file serves both platforms) are listed apart as kept but unused."""
    ours = InfraConfig.context_keys()
    unused = InfraConfig.eks_only_keys() if platform != "eks" else frozenset()
    used = ", ".join(f"{k}={json.dumps(v)}" for k, v in saved.items() if k in ours and k not in unused)
    kept = ", ".join(k for k in saved if k in unused)
    line = used or "(none: the cdk.json defaults)"
    return f"{line}; kept for EKS, unused by {platform}: {kept}" if kept else line


def stack_names(config: InfraConfig) -> list[str]:
    """The CloudFormation stacks of a deployment, in deploy order."""
    return [
        config.stack_name("network"),
        config.stack_name("storage"),
        config.stack_name("eks" if config.platform == "eks" else "pcluster"),
    ]


def storage_target(root: Path = ROOT) -> tuple[str, str | None]:
    """The storage stack (its ECR repository) and the region of the saved deployment (cdk.json's values under the
    saved ones, as a deploy merges them): where ``make image`` pushes. The region is None when none is saved."""
    context = {**json.loads((root / "cdk.json").read_text())["context"], **load_saved(root)}
    config = InfraConfig.from_context(context)
    return config.stack_name("storage"), config.region


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["storage"]:
        try:
            stack, region = storage_target(Path.cwd())  # the project root the calling script runs in
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{stack} {region or ''}".rstrip())
        return 0
    if len(argv) < 2 or argv[0] not in ("deploy", "show"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    action, platform, rest = argv[0], argv[1], argv[2:]
    dry_run = "--dry-run" in rest
    rest = [a for a in rest if a != "--dry-run"]
    try:
        if action == "show":
            saved = load_saved()
            config = InfraConfig.from_context(
                {**json.loads((ROOT / "cdk.json").read_text())["context"], **saved, "platform": platform}
            )
            print(f"[settings] saved in {SAVED_FILE}: {settings_line(saved, config.platform)}", file=sys.stderr)
            print(" ".join(stack_names(config)))
            return 0
        plan = plan_deploy(platform, rest)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    what = ", ".join(f"{k}={json.dumps(v)}" for k, v in plan.changed.items()) or "nothing new"
    if dry_run:
        print(f"[deploy] would save to {SAVED_FILE}: {what}", file=sys.stderr)
    else:
        save(plan.saved)
        print(f"[deploy] saved to {SAVED_FILE}: {what}", file=sys.stderr)
    cfg = plan.config
    print(f"[deploy] settings: {settings_line(plan.saved, plan.config.platform)}", file=sys.stderr)
    print(
        f"[deploy] {cfg.platform}: {cfg.gpu_nodes} x {cfg.gpu_instance_type}, stacks {', '.join(stack_names(cfg))}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
