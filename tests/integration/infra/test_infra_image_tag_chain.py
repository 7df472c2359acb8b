"""deploy -> make image -> make train works the first time on EKS: the runtime's default image (the store pod's)
is the tag `make image` pushes from the same checkout, unless an imageTag is saved or given; `make image` says when
a redeploy is needed and how. scripts/deploy.sh and scripts/image.sh run from a scratch project root (the real
packages linked in) so that its cdk.context.json is the test's, with fake aws/docker where a push happens."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from stacks.deploy_config import merge_settings
from stacks.synth_check import context_args
from tests.support.infra import ROOT, manifests, resources_of_type, synthesize
from tools.image_tag import source_tag

ADMIN = "arn:aws:iam::123456789012:role/PlatformAdmin"
EKS_CHOICES = ["-c", f"adminRoleArn={ADMIN}", "-c", "apiAllowedCidrs=[]"]
REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/t5ft/t5-train"


def scratch_root(tmp_path: Path, saved: dict | None = None) -> Path:
    """A project root with the real code linked in, the real cdk.json, and ``saved`` as its cdk.context.json."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    for name in ("stacks", "tools", "training", "cluster_facts", "cluster_assets", ".venv"):
        (root / name).symlink_to(ROOT / name)
    for script in ("deploy.sh", "image.sh", "cdk_lib.sh"):
        shutil.copy(ROOT / "scripts" / script, root / "scripts" / script)
    (root / "scripts/venv.sh").write_text("#!/bin/sh\n")  # the venv exists: nothing to install
    (root / "scripts/venv.sh").chmod(0o755)
    shutil.copy(ROOT / "cdk.json", root / "cdk.json")
    if saved is not None:
        (root / "cdk.context.json").write_text(json.dumps(saved))
    return root


def dry_deploy(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`DRY_RUN=1 make deploy PLATFORM=eks ARGS=...`: the process and the cdk command it would run."""
    env = {**{k: v for k, v in os.environ.items() if k != "IMAGE_TAG"}, "DRY_RUN": "1", "PLATFORM": "eks"}
    proc = subprocess.run(
        [str(root / "scripts/deploy.sh"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("[deploy] would run:")]
    return proc, shlex.split(line.removeprefix("[deploy] would run:"))  # printed with %q


def runtime_images(context: dict) -> set[str]:
    t = synthesize(context, Path(context.pop("_outdir"))).templates["Eks"]
    (runtime,) = [
        m
        for _, r in resources_of_type(t, "Custom::AWSCDK-EKS-KubernetesResource")
        for m in manifests(r)
        if m["kind"] == "ClusterTrainingRuntime"
    ]
    return {
        c["image"]
        for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for c in j["template"]["spec"]["template"]["spec"]["containers"]
    }


def test_a_first_deploy_names_the_image_make_image_pushes_from_this_checkout(tmp_path: Path) -> None:
    root = scratch_root(tmp_path)
    proc, cdk = dry_deploy(root, *EKS_CHOICES)
    tag = source_tag()
    assert f"[deploy] imageTag={tag}: this checkout's image tag, the one `make image` pushes" in proc.stderr
    assert context_args(cdk)["imageTag"] == tag
    assert (
        f'would save to cdk.context.json: adminRoleArn="{ADMIN}", apiAllowedCidrs=[], imageTag="{tag}"' in proc.stderr
    )
    # What that deploy synthesizes (the saved settings over cdk.json, as the CDK CLI merges them): the runtime's
    # image, which the store pod of every TrainJob runs, is <repository>:<the tag make image pushes>.
    plan = merge_settings("eks", cdk[cdk.index("deploy") + 2 :], root)
    cdk_json = json.loads((ROOT / "cdk.json").read_text())["context"]
    images = runtime_images({**cdk_json, **plan.saved, "platform": "eks", "_outdir": str(tmp_path / "out")})
    assert images and all(i.endswith(f":{tag}") for i in images), images


def test_a_saved_or_given_image_tag_wins_and_an_empty_one_resets_to_this_checkout(tmp_path: Path) -> None:
    saved = scratch_root(tmp_path / "saved", {"adminRoleArn": ADMIN, "apiAllowedCidrs": [], "imageTag": "v1.2"})
    # (the EKS choices are passed too: the settings check reads the saved file of the code's own checkout)
    proc, cdk = dry_deploy(saved, *EKS_CHOICES)  # a redeploy from a newer checkout keeps the saved runtime image
    assert "imageTag" not in context_args(cdk) and "[deploy] imageTag=" not in proc.stderr
    proc, cdk = dry_deploy(saved, *EKS_CHOICES, "-c", "imageTag=src-0123456789ab")
    assert context_args(cdk)["imageTag"] == "src-0123456789ab"
    _, cdk = dry_deploy(saved, *EKS_CHOICES, "-c", "imageTag=")  # dropping the saved value: back to this checkout's tag
    assert context_args(cdk)["imageTag"] == source_tag()


def fake_push_tools(bindir: Path) -> dict[str, str]:
    """aws (no image in ECR yet, a login token) and docker (build/login/push succeed) on PATH."""
    bindir.mkdir()
    (bindir / "aws").write_text(
        '#!/bin/sh\ncase "$*" in *describe-images*) exit 254 ;; *get-login-password*) echo TOKEN ;; esac\n'
    )
    (bindir / "docker").write_text("#!/bin/sh\ncat >/dev/null 2>&1 || true\nexit 0\n")
    for tool in ("aws", "docker"):
        (bindir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("IMAGE_TAG", "DRY_RUN")}
    return {**env, "PATH": f"{bindir}:{os.environ['PATH']}"}


def push(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(root / "scripts/image.sh"), "--repo", REPO, "--region", "us-east-1"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"{REPO}:{source_tag()}"
    return proc


def test_make_image_says_whether_the_runtime_already_names_the_pushed_image(tmp_path: Path) -> None:
    tag = source_tag()
    env = fake_push_tools(tmp_path / "bin")
    same = push(scratch_root(tmp_path / "same", {"imageTag": tag}), env)
    assert "[image] it is also the EKS runtime's default image (imageTag in cdk.context.json)" in same.stderr
    assert "make deploy" not in same.stderr
    other = push(scratch_root(tmp_path / "other", {"imageTag": "src-000000000000"}), env)
    assert (
        f"[image] the EKS runtime's default image is {REPO}:src-000000000000; to make it this one: make deploy "
        f'PLATFORM=eks ARGS="-c imageTag={tag}" (saved; the other settings are kept)'
    ) in other.stderr
    assert "npx cdk" not in other.stderr
    never = push(scratch_root(tmp_path / "never"), env)
    assert "default image is not set by make deploy here; to make it this one: make deploy PLATFORM=eks" in never.stderr
