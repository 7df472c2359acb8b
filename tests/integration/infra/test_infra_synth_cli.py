"""`make synth` refuses what CDK would silently ignore: unknown keys in any spelling, `-c key` without a value,
a platform key that disagrees with PLATFORM; and it synthesizes into an empty cdk.out/<PLATFORM>."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stacks.config import ConfigError, InfraConfig
from stacks.synth_check import check, context_args
from tests.support.infra import ROOT

#: (make synth ARGS, what the error must say): the mistakes a user makes in their first hour.
REFUSED = [
    (["-c", "GpuNodes=4"], r"unknown context key 'GpuNodes' \(did you mean gpuNodes\?\)"),
    (["-c", "gpu_instance_type=p4d.24xlarge"], r"'gpu_instance_type' \(did you mean gpuInstanceType\?\)"),
    (["-c", "gpu-nodes=4"], r"did you mean gpuNodes\?"),
    (["-c", "gpuNods=4"], r"'gpuNods' \(did you mean gpuNodes\?\)"),
    (["-c", "instanceCount=4"], r"unknown context key 'instanceCount': CDK would ignore it"),
    (["-c", "gpuNodes"], r"-c gpuNodes: a context option needs a value.*-c gpuNodes=VALUE"),
    (["--context=gpuNodes"], r"-c gpuNodes: a context option needs a value"),
    (["-c"], r"-c at the end of the arguments has no key=value"),
    (
        ["-c", "platform=parallelcluster"],
        r"-c platform=parallelcluster disagrees with PLATFORM=eks.*"
        r"make synth PLATFORM=parallelcluster",
    ),
    (["--output", "elsewhere"], r"--output: make synth always writes cdk.out/<PLATFORM>"),
    (["-c", "gpuNodes=0"], r"context gpuNodes=0: need at least 1 GPU node"),
]


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_mistakes_are_refused_with_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check("eks", argv)


def test_good_arguments_give_the_config_that_will_be_synthesized() -> None:
    cfg = check(
        "eks",
        [
            "-c",
            "gpuNodes=4",
            "--context",
            "gpuInstanceType=p4d.24xlarge",
            "--context=namePrefix=demo",
            "-c",
            "platform=eks",
            "--quiet",
        ],
    )
    assert (cfg.platform, cfg.gpu_nodes, cfg.gpu_instance_type, cfg.name_prefix) == ("eks", 4, "p4d.24xlarge", "demo")
    assert check("parallelcluster", []).platform == "parallelcluster"  # PLATFORM beats cdk.json's "platform"
    assert context_args(["-c", "a=1", "-c", "a=2", "-c", "b=x=y"]) == {"a": "2", "b": "x=y"}  # later wins, like CDK


def test_cdk_own_keys_are_known() -> None:
    ctx = {
        "@aws-cdk/core:newStyleStackSynthesis": True,
        "aws:cdk:enable-path-metadata": True,
        "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"],
        "acknowledged-issue-numbers": [1234],
        "cli-telemetry": False,
        "//": "doc",
        "//keys": {},
    }
    assert InfraConfig.unknown_keys(ctx) == []


def make_synth(*args: str, platform: str = "eks", timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLATFORM": platform}
    return subprocess.run(
        ["make", "-s", "synth", f"ARGS={' '.join(args)}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("-c GpuNodes=4",),
        ("-c gpu_instance_type=p4d.24xlarge",),
        ("-c gpuNodes",),
        ("-c platform=parallelcluster",),
        ("-c apiAllowedCidrs=::/0",),
        ("-c headNodeInstanceType=m7i.2xlarg",),
    ],
)
def test_make_synth_exits_2_before_cdk_starts(args: tuple[str, ...]) -> None:
    proc = make_synth(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr  # the first thing said: before Node and CDK start
    assert proc.stderr.count("\n") <= 2 and "Traceback" not in proc.stderr, proc.stderr  # the line (+ make's)
    assert args[0].split()[1].split("=")[0] in proc.stderr  # names the key


def test_make_synth_writes_only_this_synth_into_an_empty_directory() -> None:
    out = ROOT / "cdk.out" / "eks"
    out.mkdir(parents=True, exist_ok=True)
    stale = out / "ParallelCluster.template.json"
    stale.write_text("{}")  # what an earlier synth of the other platform would have left
    proc = make_synth("-c gpuNodes=3", "-c gpuInstanceType=p4d.24xlarge")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not stale.exists()
    assert sorted(p.name for p in out.glob("*.template.json")) == [
        "Eks.template.json",
        "Network.template.json",
        "Storage.template.json",
    ]
    assert "[synth] eks: 3 x p4d.24xlarge" in proc.stderr
    lt = [
        r
        for r in json.loads((out / "Eks.template.json").read_text())["Resources"].values()
        if r["Type"] == "AWS::EC2::LaunchTemplate"
        and r["Properties"]["LaunchTemplateData"].get("InstanceType") == "p4d.24xlarge"
    ]
    assert len(lt) == 1  # the GPU node group got the instance type asked for, not the default p5.48xlarge


def test_app_refuses_unknown_keys_for_cdk_deploy_too() -> None:
    # `npx cdk deploy -c ...` runs app.py without synth_check: the app itself refuses the typo.
    proc = subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "CDK_CONTEXT_JSON": json.dumps({"GpuNodes": "4", "aws:cdk:x": True}),
            "CDK_OUTDIR": "/tmp/t5-infra-unused",
        },
    )
    assert proc.returncode == 2
    assert "unknown context key 'GpuNodes' (did you mean gpuNodes?)" in proc.stderr
