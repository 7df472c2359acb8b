"""Helpers for the infrastructure tests: synthesize once, read templates, run the real validators."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]

# jsii prints a 12-line banner per process on Node 20; the synth script reports the Node version instead.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ["CDK_DISABLE_CLI_TELEMETRY"] = "true"

#: cfn-lint warnings we accept, each with the reason. Errors are never accepted.
ACCEPTED_CFN_LINT_WARNINGS = {
    "W3005": "aws-cdk-lib's kubectl provider declares DependsOn on roles it also references with GetAtt",
    "W6001": "the platform stack re-exposes storage outputs (ECR URI, FSx id, bucket) so `make train` reads one stack",
}


@dataclass
class Synthesized:
    """One synthesized app: templates by stack id, the output directory, and the stack objects."""

    outdir: Path
    platform_app: Any  # stacks.app_factory.PlatformApp
    templates: dict[str, dict[str, Any]]

    def template(self, stack_id: str) -> Any:
        """An ``aws_cdk.assertions.Template`` of a stack (from the already synthesized JSON: no re-synth)."""
        from aws_cdk.assertions import Template  # noqa: PLC0415

        return Template.from_json(self.templates[stack_id])

    @property
    def validation_report(self) -> dict[str, Any]:
        return json.loads((self.outdir / "validation-report.json").read_text())


def synthesize(context: dict[str, Any], outdir: Path) -> Synthesized:
    """Build the app exactly as ``cdk synth`` would (cdk.json context + ``context``) and synthesize it
    with cdk-nag on. Raises if cdk-nag or CDK validation fails."""
    from stacks.app_factory import build_stacks, new_app  # noqa: PLC0415
    from stacks.config import InfraConfig  # noqa: PLC0415

    app = new_app(context, outdir=outdir)
    config = InfraConfig.from_context(app.node.try_get_context)
    built = build_stacks(app, config)
    assembly = app.synth()
    templates = {s.stack_name: s.template for s in assembly.stacks}
    by_id = {stack.node.id: templates[stack.stack_name] for stack in (built.network, built.storage, built.platform)}
    return Synthesized(outdir=outdir, platform_app=built, templates=by_id)


def run_cfn_lint(templates: list[Path]) -> list[dict[str, Any]]:
    """Run the real cfn-lint (project venv) on ``templates``; returns its JSON findings."""
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    proc = subprocess.run(
        [str(cfn_lint), "--format", "json", *map(str, templates)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode not in (0, 2, 4, 6, 8, 10, 12, 14) or not proc.stdout.strip():
        raise RuntimeError(f"cfn-lint failed to run (rc={proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def resolve_placeholders(value: Any, fill: dict[str, str], key: str = "") -> Any:
    """Replace CloudFormation intrinsics in ``value`` by placeholder strings chosen by the enclosing key
    (e.g. every token under ``SubnetIds`` becomes ``fill["SubnetIds"]``). Unknown keys raise."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)).startswith(("Fn::", "Ref")):
            if key not in fill:
                raise KeyError(f"no placeholder for a token under {key!r}: {value}")
            return fill[key]
        return {k: resolve_placeholders(v, fill, k) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_placeholders(v, fill, key) for v in value]
    return value


def manifests(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """Kubernetes objects of a ``Custom::AWSCDK-EKS-KubernetesResource``; tokens become ``"<token>"``."""
    raw = resource["Properties"]["Manifest"]
    if isinstance(raw, dict):  # {"Fn::Join": ["", [str | token, ...]]}; tokens sit inside JSON strings
        raw = "".join(p if isinstance(p, str) else "<token>" for p in raw["Fn::Join"][1])
    return json.loads(raw)


def resources_of_type(template: dict[str, Any], type_: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for logical_id, res in template["Resources"].items():
        if res["Type"] == type_:
            yield logical_id, res
