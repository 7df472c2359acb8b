"""Submit the T5 job to EKS as a Kubeflow Trainer TrainJob, follow node 0's log, wait, report.

    python -m tools.k8s.submit [options] [-- TRAINING ARGS]
    python -m tools.k8s.submit --dry-run --nodes 2 -- --train.steps 500   # print the YAML only
    python -m tools.k8s.submit --print-runtime                              # the runtime the stack installs

Training arguments (``--section.field value``, see ``python -m training --help``) may also be given without
``--``: every unknown option that contains a dot is passed to the training job. Defaults are the EKS stack's
defaults (cluster_facts: namespace, runtime name, FSx claim and mount, GPU instance type; a deployment's own
values come from ``--outputs-file``) and the environment the Makefile exports (PRESET, NODES, NPROC, DRY_RUN;
IMAGE overrides the image, IMAGE_TAG its tag). The image is this checkout's, as ``make image`` tags it
(tools/image_tag.py), in the stack's ECR repository.

Exit codes: 0 the TrainJob completed (or dry run), 1 it failed or timed out, 2 bad arguments or the cluster
is not ready (no kubeconfig, unreachable API, Trainer not installed, runtime/PVC/namespace/image missing, the
cluster's etcd not bootstrapped or the job's etcd user not created).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cluster_assets.k8s import etcd, schema
from cluster_assets.k8s.runtime import NODE, container_images
from cluster_assets.k8s.trainjob import MAX_NAME_LEN, TrainJobConfig, TrainJobError, to_yaml, train_job_manifest
from cluster_assets.training_args import TrainingArgsError, split_training_flags
from cluster_assets.training_args import check_training_args as shared_check
from cluster_facts.names import NODE_POOL_LABEL, SYSTEM_POOL
from cluster_facts import (
    DEFAULT_GPU_INSTANCE_TYPE,
    DEFAULT_MAX_RESTARTS,
    FSX_MOUNT_PATH,
    FSX_PVC_NAME,
    GPU_INSTANCES,
    RUNTIME_NAME,
    TRAINING_NAMESPACE,
)
from tools.env_flags import EnvFlagError, env_count, env_flag
from tools.image_tag import check_tag, source_tag

DEFAULT_PRESET = "t5-base"
#: The stack's system node group: where the etcd administration pods run (stacks/components/eks_cluster.py).
SYSTEM_POOL_LABEL = {NODE_POOL_LABEL: SYSTEM_POOL}
#: Placeholder image for an offline dry run with no stack outputs (a valid reference, clearly not real).
PLACEHOLDER_IMAGE = "t5-failover-train:set-image-with--image"
#: What --print-etcd shows for the administration image: the stack builds it (a CDK asset) when it deploys.
PRINTED_ADMIN_IMAGE = "t5-etcd-admin:built-by-the-eks-stack"


#: EKS stack outputs (stacks/eks_stack.py) -> the submit option they provide a default for.
OUTPUT_DEFAULTS = {
    "TrainingNamespace": "namespace",
    "RuntimeName": "runtime",
    "FsxClaimName": "pvc",
    "GpuInstanceType": "instance_type",
}


def read_outputs(path: str) -> dict[str, str]:
    """All outputs of a ``cdk deploy --outputs-file`` JSON ({stack: {OutputKey: value}}), merged."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise TrainJobError(f"--outputs-file {path}: cannot read JSON ({e})") from None
    return {k: str(v) for outputs in data.values() if isinstance(outputs, dict) for k, v in outputs.items()}


def image_from_outputs(path: str) -> str:
    """The ECR repository URI from a ``cdk deploy --outputs-file`` JSON."""
    found = [
        v
        for k, v in read_outputs(path).items()
        if ("ecr" in k.lower() and "uri" in k.lower()) or k.lower().endswith("repositoryuri")
    ]
    if not found:
        raise TrainJobError(
            f"--outputs-file {path}: no ECR repository URI output (a key like EcrRepositoryUri); pass --image instead"
        )
    return found[0]


def apply_output_defaults(a: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Options left at their defaults take the EKS stack's outputs (namespace, runtime, PVC, instance type)."""
    if not a.outputs_file:
        return
    outputs = read_outputs(a.outputs_file)
    for key, dest in OUTPUT_DEFAULTS.items():
        if key in outputs and getattr(a, dest) == parser.get_default(dest):
            setattr(a, dest, outputs[key])


def split_at_dashes(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(our options, the training arguments: dotted flags with their values, --config FILE and everything after a
    bare ``--``); ``None`` = ``sys.argv[1:]``. Split before argparse: it would take the value of ``--train.steps -1``
    for an option of its own (cluster_assets.training_args.split_training_flags, the Slurm submit's rule too)."""
    return split_training_flags(list(sys.argv[1:] if argv is None else argv))


def split_training_args(unknown: list[str], after_dashes: list[str]) -> list[str]:
    """The training arguments (``after_dashes``: what :func:`split_at_dashes` set aside), after the options argparse
    did not know (``unknown``): an unknown option is an error naming it; a dotted one is passed on."""
    for a in unknown:
        if a.startswith("-") and "." not in a.split("=")[0]:
            raise TrainJobError(
                f"unknown option {a}: submit options are listed by --help; training options look "
                "like --section.field (python -m training --help)"
            )
    return unknown + after_dashes


def check_training_args(cfg: TrainJobConfig) -> None:
    """Validate the training arguments here, before anything reaches the cluster (the Slurm submit runs the same
    check: cluster_assets/training_args.py). Paths are the pods' (under the FSx mount): what they point at is
    checked by the job's agent in the pod before any worker starts (training.job.check: exit 2, which the
    runtime does not retry); a --config must be on FSx, where the pods can read it."""
    argv, i = [], 0
    targs = list(cfg.training_args)
    while i < len(targs):
        a = targs[i]
        name, eq, val = a.partition("=")
        if name == "--config":
            path = val if eq else (targs[i + 1] if i + 1 < len(targs) else "")
            if not path.startswith(cfg.fsx_mount_path.rstrip("/") + "/"):
                raise TrainJobError(
                    f"--config {path}: the pods cannot read files from this machine; put the TOML "
                    f"on FSx (under {cfg.fsx_mount_path}/) or pass --section.field flags"
                )
            i += 1 if eq else 2
            continue
        argv.append(a)
        i += 1
    try:
        shared_check(
            cfg.preset, argv, nodes=cfg.num_nodes, nproc_per_node=cfg.nproc_per_node, gpus_per_node=cfg.gpus_per_node
        )
    except TrainingArgsError as e:
        raise TrainJobError(str(e)) from None


def _env_count(p: argparse.ArgumentParser, name: str, default: int | None, minimum: int) -> int | None:
    """An integer Makefile variable (NODES, SPARES, NPROC) from the environment; a bad one exits 2 naming it."""
    try:
        return env_count(name, default, minimum)
    except EnvFlagError as e:
        p.exit(2, f"error: {e}\n")


class _OneLineParser(argparse.ArgumentParser):
    """A bad option value is one ``error:`` line naming it (exit 2), not a usage dump above it."""

    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def _seconds(text: str, *, zero: str | None, fix: str) -> float:
    """A finite number of seconds > 0 (>= 0 when ``zero`` says what 0 means); else an argparse error naming
    ``text`` and ``fix``: a negative --timeout or a zero --poll would report a timeout or poll without pause."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if math.isfinite(value) and (value > 0 or (zero and value == 0)):
        return value
    bound, or_zero = (">= 0", f", or 0 {zero}") if zero else ("> 0", "")
    raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds {bound}: {fix}{or_zero}")


def _timeout(text: str) -> float:
    return _seconds(text, zero="to wait without limit", fix="give how long to wait for the job, e.g. 7200")


def _poll(text: str) -> float:
    return _seconds(text, zero=None, fix="give the pause between status checks, e.g. 5")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = _OneLineParser(
        prog="python -m tools.k8s.submit",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("job")
    g.add_argument(
        "--name",
        help=f"TrainJob name = per-job directory on FSx (re-use a name to resume its "
        f"checkpoints; <= {MAX_NAME_LEN} chars). Default: t5-<preset>-<timestamp>",
    )
    g.add_argument(
        "--preset",
        default=env.get("PRESET") or DEFAULT_PRESET,
        help=f"training preset (env PRESET; default {DEFAULT_PRESET})",
    )
    g.add_argument("--namespace", default=TRAINING_NAMESPACE, help="namespace with the FSx PVC (default %(default)s)")
    g.add_argument("--runtime", default=RUNTIME_NAME, help="ClusterTrainingRuntime name (default %(default)s)")
    g.add_argument(
        "--image",
        default=env.get("IMAGE"),
        help="training image (env IMAGE); default: the ECR repository (--outputs-file's, else the "
        "installed runtime's) with --image-tag",
    )
    g.add_argument("--outputs-file", help="`cdk deploy --outputs-file` JSON to take the ECR repository URI from")
    g.add_argument(
        "--image-tag",
        default=env.get("IMAGE_TAG") or source_tag(),
        help="tag in that repository (env IMAGE_TAG); default: this checkout's, as `make image` tags "
        "and pushes it (%(default)s)",
    )
    g = p.add_argument_group("size")
    g.add_argument("--nodes", type=int, default=_env_count(p, "NODES", 2, 1), help="nodes/pods (env NODES; 2)")
    g.add_argument(
        "--spares",
        type=int,
        default=_env_count(p, "SPARES", 0, 0),
        help="hot-spare pods beyond --nodes, each on its own GPU node: they wait in the rendezvous and "
        "take a lost pod's place in seconds (env SPARES; default 0)",
    )
    g.add_argument(
        "--instance-type",
        default=DEFAULT_GPU_INSTANCE_TYPE,
        help="GPU instance type: sets GPUs and EFA interfaces per node (default %(default)s)",
    )
    g.add_argument("--gpus-per-node", type=int, help="nvidia.com/gpu per pod (default: the instance's; 0 = CPU)")
    g.add_argument("--efa-per-node", type=int, help="EFA interfaces per pod (default: the instance's; 0 = none)")
    g.add_argument(
        "--nproc-per-node",
        type=int,
        default=_env_count(p, "NPROC", None, 1),
        help="workers per pod (env NPROC; default one per GPU, 1 without GPUs)",
    )
    g.add_argument("--cpu", default="", help="CPU request per pod (e.g. 32); default none")
    g.add_argument("--memory", default="64Gi", help="memory request per pod (default %(default)s)")
    g = p.add_argument_group("advanced")
    g.add_argument("--fsx-mount", default=FSX_MOUNT_PATH, help="FSx mount path in the runtime (default %(default)s)")
    g.add_argument(
        "--pvc",
        default=FSX_PVC_NAME,
        help="FSx PVC the runtime mounts (for --print-runtime and the pre-flight check; default %(default)s)",
    )
    g.add_argument(
        "--launcher-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `python -m training.launch` option (repeatable), e.g. --launcher-arg=--max-restarts=5",
    )
    g.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra container env")
    try:
        dry_run = env_flag("DRY_RUN", env)
    except EnvFlagError as e:  # before anything else: a bad DRY_RUN must not be mistaken for "submit"
        p.exit(2, f"error: {e}\n")
    g = p.add_argument_group("run")
    g.add_argument(
        "--dry-run",
        action="store_true",
        default=dry_run,
        help="print the TrainJob YAML and exit (env DRY_RUN=1/true/yes/on); no cluster needed",
    )
    g.add_argument(
        "--print-runtime",
        action="store_true",
        help="print our ClusterTrainingRuntime YAML (with --dry-run: before the TrainJob)",
    )
    g.add_argument(
        "--print-etcd",
        action="store_true",
        help="print the etcd objects the EKS stack installs in namespace t5-etcd (members, PDB, "
        f"NetworkPolicy, administration; the administration image shows as {PRINTED_ADMIN_IMAGE})",
    )
    g.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help="runtime maxRestarts for --print-runtime (the stack sets it; default %(default)s)",
    )
    g.add_argument("--context", help="kubeconfig context (default: current)")
    g.add_argument("--detach", action="store_true", help="submit and exit without waiting")
    g.add_argument("--no-logs", action="store_true", help="wait without streaming node 0's log")
    g.add_argument("--timeout", type=_timeout, default=0, help="give up waiting after this many seconds (0 = never)")
    g.add_argument("--skip-image-check", action="store_true", help="don't look the image tag up in ECR first")
    g.add_argument("--poll", type=_poll, default=5.0, help="seconds between status checks (> 0; default 5)")
    return p


def check_submit_options(a: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The options that reach no manifest check: the image tag (env IMAGE_TAG or --image-tag) and the runtime's
    --max-restarts. Raises TrainJobError naming the value as it was given."""
    from_env = a.image_tag == parser.get_default("image_tag") and bool(os.environ.get("IMAGE_TAG"))
    try:
        check_tag(a.image_tag, "IMAGE_TAG" if from_env else "--image-tag")
    except ValueError as e:
        raise TrainJobError(str(e)) from None
    if a.max_restarts < 0:
        raise TrainJobError(
            f"--max-restarts {a.max_restarts}: use 0 or more (whole-job restarts of the runtime "
            f"--print-runtime renders)"
        )
    if a.max_restarts != DEFAULT_MAX_RESTARTS and not a.print_runtime:
        raise TrainJobError(
            f"--max-restarts {a.max_restarts} changes nothing without --print-runtime: the deployed "
            f"runtime's whole-job restarts come from the stack (context maxRestarts); for restarts of "
            f"a crashed worker inside a pod pass --launcher-arg=--max-restarts={a.max_restarts}"
        )


def config_from_args(a: argparse.Namespace, training_args: list[str]) -> TrainJobConfig:
    gpus, efa = a.gpus_per_node, a.efa_per_node
    if gpus is None or efa is None:
        spec = GPU_INSTANCES.get(a.instance_type)
        if spec is None:
            raise TrainJobError(
                f"--instance-type {a.instance_type!r} is unknown; use one of "
                f"{', '.join(sorted(GPU_INSTANCES))} or give --gpus-per-node and --efa-per-node"
            )
        gpus = spec.gpus if gpus is None else gpus
        efa = spec.efa_interfaces if efa is None else efa
    nproc = a.nproc_per_node if a.nproc_per_node is not None else (gpus or 1)
    image = a.image
    if not image and a.outputs_file:
        image = f"{image_from_outputs(a.outputs_file)}:{a.image_tag}"
    if not image:
        # Submitting: the runtime's default image (the stack's ECR repository + imageTag) is filled in from
        # the cluster after connecting. Dry run (offline): a placeholder that is clearly not real.
        image = PLACEHOLDER_IMAGE
    env_pairs = []
    for e in a.env:
        k, eq, v = e.partition("=")
        if not eq:
            raise TrainJobError(f"--env {e!r}: expected NAME=VALUE")
        env_pairs.append((k, v))
    name = a.name or default_name(a.preset)
    cfg = TrainJobConfig(
        name=name,
        namespace=a.namespace,
        image=image,
        runtime_name=a.runtime,
        fsx_mount_path=a.fsx_mount,
        num_nodes=a.nodes,
        spares=a.spares,
        nproc_per_node=nproc,
        gpus_per_node=gpus,
        efa_per_node=efa,
        cpu_request=a.cpu,
        memory_request=a.memory,
        preset=a.preset,
        training_args=tuple(training_args),
        launcher_args=tuple(a.launcher_arg),
        env=tuple(env_pairs),
    )
    return cfg


def default_name(preset: str) -> str:
    base = preset if preset.startswith("t5") else f"t5-{preset}"
    base = "".join(c if c.isalnum() else "-" for c in base.lower()).strip("-")[:24]
    return f"{base}-{time.strftime('%m%d-%H%M%S')}"


def runtime_manifest(a: argparse.Namespace, cfg: TrainJobConfig) -> dict[str, Any]:
    """Our ClusterTrainingRuntime, rendered by the same function the EKS stack installs it with."""
    from cluster_assets.k8s.runtime import build_cluster_training_runtime

    spec = GPU_INSTANCES.get(a.instance_type)
    rdma = bool(spec and spec.gpudirect_rdma and cfg.gpus_per_node and cfg.efa_per_node)
    return schema.validate(
        build_cluster_training_runtime(
            name=cfg.runtime_name,
            pvc_name=a.pvc,
            image=cfg.image,
            max_restarts=a.max_restarts,
            gpus_per_node=cfg.gpus_per_node,
            efa_per_node=cfg.efa_per_node,
            gpudirect_rdma=rdma,
            fsx_mount_path=cfg.fsx_mount_path,
        )
    )


# ------------------------------------------------------------------------------------------- submit/watch
def check_image(image: str) -> str | None:
    """Look an ECR image tag up with boto3; returns a problem or None (skipped without credentials)."""
    code = missing_in_ecr(image)
    if code:
        return (
            f"image {image} is missing in ECR ({code}): build and push it with `make image` "
            f"(or pass the tag that exists with --image-tag)"
        )
    return None


def missing_in_ecr(image: str) -> str | None:
    """The ECR error code (ImageNotFoundException, RepositoryNotFoundException) when ``image``, an ECR image
    reference, is not in its repository; None when it is there, is no ECR image, or cannot be checked (no
    credentials, no network: a note says so)."""
    import re

    m = re.match(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)(?::([^@]+))?$", image)
    if not m:
        return None
    account, region, repo, tag = m.groups()
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover
        return None
    try:
        boto3.client("ecr", region_name=region).describe_images(
            registryId=account, repositoryName=repo, imageIds=[{"imageTag": tag or "latest"}]
        )
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return code
        print(f"note: could not check the image in ECR ({code}); continuing", file=sys.stderr)
    except BotoCoreError as e:
        print(f"note: could not check the image in ECR ({type(e).__name__}); continuing", file=sys.stderr)
    return None


def preflight(cluster, a: argparse.Namespace, cfg: TrainJobConfig) -> str | None:
    """Everything that would make the TrainJob fail for reasons a user can fix before submitting.

    Returns the image to use when no --image was given: the repository of the runtime's default image (its
    ``node`` container's, i.e. the stack's ECR repository) with ``--image-tag`` (default: this checkout's tag,
    the one `make image` pushes), so the job runs the code it was submitted from."""
    from tools.k8s.cluster import ClusterError

    cluster.check_trainer()
    rt = cluster.get_runtime(cfg.runtime_name)
    cluster.check_namespace(cfg.namespace)
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for rj in rt["spec"]["template"]["spec"]["replicatedJobs"]
        for v in rj["template"]["spec"]["template"]["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    ]
    for c in claims:
        cluster.check_pvc(cfg.namespace, c)
    if cluster.train_job_exists(cfg.namespace, cfg.name):
        raise ClusterError(
            f"TrainJob {cfg.namespace}/{cfg.name} already exists: pick another --name, or delete "
            f"it first (`kubectl delete trainjob -n {cfg.namespace} {cfg.name}`; its checkpoints "
            f"on FSx stay, and re-submitting the same name resumes from them)"
        )
    if not a.skip_image_check and cfg.image != PLACEHOLDER_IMAGE:
        problem = check_image(cfg.image)
        if problem:
            raise ClusterError(problem)
    images = container_images(rt)
    if not a.skip_image_check:
        check_runtime_images(cfg.runtime_name, images)
    runtime_image = images.get(f"{NODE}/{NODE}")
    return with_tag(runtime_image, a.image_tag) if runtime_image else None


def check_runtime_images(runtime_name: str, images: dict[str, str]) -> None:
    """Every image the runtime itself makes a job pull (any container but the node's, whose image the TrainJob
    sets) is in the registry before the TrainJob is created; ClusterError naming the pod, the image and the fix
    otherwise."""
    from tools.k8s.cluster import ClusterError

    for where, image in images.items():
        if where == f"{NODE}/{NODE}":  # replaced by the TrainJob's image, checked on its own
            continue
        code = missing_in_ecr(image)
        if code:
            raise ClusterError(
                f"the {where.split('/')[0]} pod of every job on runtime {runtime_name} would pull "
                f"{image}, which is missing in ECR ({code}): push the training image with `make "
                f'image` and redeploy with its tag (`make deploy PLATFORM=eks ARGS="-c '
                f'imageTag=<the tag it printed>"`), so that the runtime names an image that exists '
                f"(docs/kubernetes.md); then submit again"
            )


#: How long the add-job Job may take: the first one on a system node pulls the training image (several GB).
ADD_JOB_TIMEOUT_S = 900.0


def check_etcd_ready(cluster, cfg: TrainJobConfig) -> None:
    """The cluster's etcd has been bootstrapped: the agents' client Secret exists in the training namespace."""
    from tools.k8s.cluster import ClusterError

    if not cluster.secret_exists(cfg.namespace, etcd.CLIENT_SECRET):
        raise ClusterError(
            f"Secret {cfg.namespace}/{etcd.CLIENT_SECRET} is missing: the cluster's etcd is not bootstrapped yet. The "
            f"stack's etcd-bootstrap Job (namespace {etcd.ETCD_NAMESPACE}) makes it once the training image is in ECR; "
            f"see `kubectl -n {etcd.ETCD_NAMESPACE} get jobs` and its log (docs/kubernetes.md)"
        )


def add_etcd_job_user(
    cluster, cfg: TrainJobConfig, *, timeout_s: float = ADD_JOB_TIMEOUT_S, poll_s: float = 2.0
) -> None:
    """Create the TrainJob's etcd user, role and password Secret with the administrative credentials, inside the
    cluster: a short Job in the etcd namespace (:func:`cluster_assets.k8s.etcd.add_job_job`) running the stack's
    administration image (the one its certificate-renewal CronJob runs), never the submitter's training image. Why
    a Job and not this machine: root's password never leaves the cluster, and the members are reachable only from
    pods the NetworkPolicy admits (no port-forward, no kubectl needed here)."""
    from tools.k8s.cluster import ClusterError

    admin_image = cluster.cronjob_image(etcd.ETCD_NAMESPACE, etcd.RENEWAL_CRONJOB)
    if not admin_image:
        raise ClusterError(
            f"CronJob {etcd.ETCD_NAMESPACE}/{etcd.RENEWAL_CRONJOB} is missing: the stack installs it with the etcd "
            f"administration image the submit runs; redeploy the EKS stack (make deploy PLATFORM=eks)"
        )
    manifest = etcd.add_job_job(
        cfg.name, admin_image=admin_image, training_namespace=cfg.namespace, node_selector=SYSTEM_POOL_LABEL
    )
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    if cluster.job_status(ns, name) is not None:  # a previous submission of this name: run it again
        cluster.delete_job(ns, name)
        deadline = time.time() + 60
        while cluster.job_status(ns, name) is not None and time.time() < deadline:
            time.sleep(poll_s)
    cluster.create_job(manifest)
    print(f"[submit] etcd: creating user job-{cfg.name} (Job {ns}/{name})", flush=True)
    deadline, said = time.time() + timeout_s, False
    while True:
        status = cluster.job_status(ns, name) or {}
        if status.get("succeeded"):
            return
        if any(c.get("type") == "Failed" and c.get("status") == "True" for c in status.get("conditions") or []):
            tail = cluster.job_log_tail(ns, name).strip().splitlines()
            raise ClusterError(
                f"etcd user for TrainJob {cfg.name} not created: Job {ns}/{name} failed"
                + (f" ({tail[-1]})" if tail else "")
                + f"; see `kubectl -n {ns} logs job/{name}`"
            )
        if time.time() > deadline:
            raise ClusterError(
                f"etcd user for TrainJob {cfg.name} not created within {timeout_s:.0f} s: see "
                f"`kubectl -n {ns} describe job {name}`"
            )
        if not said and time.time() > deadline - timeout_s + 30:
            print(
                f"[submit] etcd: still waiting for Job {ns}/{name} (its first run on a node pulls its image)",
                flush=True,
            )
            said = True
        time.sleep(poll_s)


def with_tag(image: str, tag: str) -> str:
    """``image`` (``registry/repo[:tag][@digest]``) with its tag replaced by ``tag``."""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}:{tag}"


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def follow_node0(cluster, ns: str, name: str, stop: threading.Event, finishing: threading.Event) -> None:
    """Stream node 0's log, moving to the new node-0 pod after each replacement or JobSet restart.

    ``finishing``: the TrainJob is done; return once the current log stream has ended."""
    from tools.k8s.cluster import pod_attempt

    seen: set[str] = set()
    while not stop.is_set():
        try:
            pod = cluster.node_pod(ns, name, 0)
        except Exception:  # noqa: BLE001 - transient API errors: retry
            pod = None
        if pod is None or pod.metadata.uid in seen or pod.status.phase == "Pending":
            if finishing.is_set():
                return
            stop.wait(3)
            continue
        seen.add(pod.metadata.uid)
        tag = f"[node-0 attempt {pod_attempt(pod)}]"
        for line in cluster.follow_logs(ns, pod.metadata.name):
            print(f"{tag} {line}", flush=True)
            if stop.is_set():
                return


def watch(cluster, cfg: TrainJobConfig, *, logs: bool, timeout_s: float, poll_s: float = 5.0) -> int:
    """Wait for the TrainJob to finish; print restarts and pod problems; return the exit code."""
    from tools.k8s.cluster import ClusterError, pod_start_problem

    ns, name = cfg.namespace, cfg.name
    stop, finishing = threading.Event(), threading.Event()
    tail = None
    if logs:
        tail = threading.Thread(target=follow_node0, args=(cluster, ns, name, stop, finishing), daemon=True)
        tail.start()
    t0, last_restarts, last_pending = time.time(), 0, 0.0
    try:
        while True:
            tj = cluster.get_train_job(ns, name)
            if tj is None:
                raise ClusterError(f"TrainJob {ns}/{name} disappeared (deleted?)")
            js = cluster.get_jobset(ns, name) or {}
            restarts = (js.get("status") or {}).get("restarts", 0) or 0
            if restarts != last_restarts:
                print(
                    f"[submit] JobSet restart #{restarts} (all pods recreated; training resumes from the newest "
                    f"complete checkpoint in {cfg.job_dir}/checkpoints)",
                    flush=True,
                )
                last_restarts = restarts
            done, failed = condition(tj, "Complete"), condition(tj, "Failed")
            if done or failed:
                finishing.set()
                if tail is not None:  # let node 0's last lines (final checkpoint, summary) arrive first
                    tail.join(timeout=15)
                stop.set()
                took = time.time() - t0
                c = done or failed
                print(
                    f"[submit] TrainJob {ns}/{name} {'completed' if done else 'FAILED'} after {took:,.0f} s, "
                    f"{restarts} JobSet restart(s): {c.get('reason', '')} {c.get('message', '')}".rstrip(),
                    flush=True,
                )
                print(f"[submit] checkpoints and metrics: {cfg.job_dir}/ on FSx (S3-linked)", flush=True)
                return 0 if done else 1
            # every pod of the job, the store's too: one that cannot start stops the watch with its line
            problems = [pr for p in cluster.pods(ns, name, None) if (pr := pod_start_problem(p, ns, name))]
            for problem in problems:
                if problem.fatal:
                    raise ClusterError(problem.line)
            if problems and time.time() - last_pending > 60:  # waiting for nodes: say so once a minute
                for problem in problems:
                    print(f"[submit] {problem.line}", flush=True)
                last_pending = time.time()
            if timeout_s and time.time() - t0 > timeout_s:
                print(
                    f"[submit] timed out after {timeout_s:.0f} s; the TrainJob keeps running "
                    f"(kubectl get trainjob -n {ns} {name})",
                    file=sys.stderr,
                )
                return 1
            time.sleep(poll_s)
    finally:
        stop.set()


def main(argv: list[str] | None = None) -> int:
    argv, after = split_at_dashes(argv)
    parser = build_parser()
    a, unknown = parser.parse_known_args(argv)
    try:
        apply_output_defaults(a, parser)
        check_submit_options(a, parser)
        cfg = config_from_args(a, split_training_args(unknown, after))
        manifest = train_job_manifest(cfg)
        check_training_args(cfg)
        docs = []
        if a.print_etcd:
            docs += [
                o
                for group in etcd.cluster_objects(
                    admin_image=PRINTED_ADMIN_IMAGE, training_namespace=cfg.namespace, node_selector=SYSTEM_POOL_LABEL
                ).values()
                for o in group
            ]
        if a.print_runtime:
            docs.append(runtime_manifest(a, cfg))
        if a.dry_run:
            docs.append(manifest)
    except (TrainJobError, schema.SchemaError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.dry_run and cfg.image == PLACEHOLDER_IMAGE:  # after the checks: an error stays the only line
        print(
            f"note: no --image/--outputs-file given: the dry run shows the placeholder image {cfg.image} (a "
            f"submission uses <the installed runtime's ECR repository>:{a.image_tag}, this checkout's image "
            f"as `make image` pushes it)",
            file=sys.stderr,
        )
    if docs:
        print(to_yaml(*docs), end="")
        return 0

    from tools.k8s.cluster import ClusterError, connect

    try:
        cluster = connect(a.context)
        print(f"[submit] cluster {cluster.host} (context {cluster.context})", flush=True)
        runtime_image = preflight(cluster, a, cfg)
        if cfg.image == PLACEHOLDER_IMAGE:
            if not runtime_image:
                raise ClusterError(f"no image: runtime {cfg.runtime_name} has none; pass --image <ECR URI>:<tag>")
            cfg = replace(cfg, image=runtime_image)
            manifest = train_job_manifest(cfg)
            if not a.skip_image_check and (problem := check_image(cfg.image)):
                raise ClusterError(problem)
        check_etcd_ready(cluster, cfg)
        add_etcd_job_user(cluster, cfg)
        cluster.create_train_job(manifest)
        spares = f" + {cfg.spares} hot spare(s)" if cfg.spares else ""
        print(
            f"[submit] created TrainJob {cfg.namespace}/{cfg.name}: {cfg.num_nodes} node(s) x "
            f"{cfg.nproc_per_node} worker(s){spares}, image {cfg.image}, job dir {cfg.job_dir}",
            flush=True,
        )
        if a.detach:
            print(f"[submit] detached; watch with `kubectl get trainjob -n {cfg.namespace} {cfg.name} -w`")
            return 0
        return watch(cluster, cfg, logs=not a.no_logs, timeout_s=a.timeout, poll_s=a.poll)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\n[submit] stopped watching; the TrainJob keeps running (kubectl delete trainjob -n "
            f"{cfg.namespace} {cfg.name} to stop it)",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
