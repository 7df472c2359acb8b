"""The real validators on both apps: cfn-lint (0 errors) and cdk-nag AwsSolutions (0 unacknowledged
findings, every acknowledgement with a specific reason)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.support.infra import ACCEPTED_CFN_LINT_WARNINGS, Synthesized, run_cfn_lint


@pytest.fixture(scope="module")
def lint_findings(eks: Synthesized, pcluster: Synthesized) -> list[dict]:
    templates = sorted([*eks.outdir.glob("*.template.json"), *pcluster.outdir.glob("*.template.json")])
    assert len(templates) == 6, templates
    return run_cfn_lint(templates)


def test_cfn_lint_finds_no_errors(lint_findings: list[dict]) -> None:
    errors = [f for f in lint_findings if f["Level"] == "Error"]
    assert not errors, json.dumps(errors, indent=1)[:4000]


def test_cfn_lint_warnings_are_only_the_accepted_ones(lint_findings: list[dict]) -> None:
    levels = Counter(f["Level"] for f in lint_findings)
    print(
        f"cfn-lint findings by level: {dict(levels)}; by rule: {dict(Counter(f['Rule']['Id'] for f in lint_findings))}"
    )
    unexpected = [f for f in lint_findings if f["Rule"]["Id"] not in ACCEPTED_CFN_LINT_WARNINGS]
    assert not unexpected, json.dumps(unexpected, indent=1)[:4000]


def test_cfn_lint_really_runs(tmp_path: Path) -> None:
    """Negative control: a broken template yields errors through the same runner."""
    bad = tmp_path / "bad.template.json"
    bad.write_text(
        json.dumps(
            {
                "Resources": {
                    "B": {"Type": "AWS::S3::Bucket", "Properties": {"VersioningConfiguration": {"Status": "Maybe"}}}
                }
            }
        )
    )
    assert any(f["Level"] == "Error" for f in run_cfn_lint([bad]))


@pytest.mark.parametrize("app", ["eks", "pcluster"])
def test_cdk_nag_has_no_unacknowledged_findings(app: str, request: pytest.FixtureRequest) -> None:
    synthesized: Synthesized = request.getfixturevalue(app)
    report = synthesized.validation_report
    violations = [v for plugin in report["pluginReports"] for v in plugin.get("violations", [])]
    assert not violations, json.dumps(violations, indent=1)[:4000]  # synth would also have raised


def _acknowledgements(synthesized: Synthesized) -> list[tuple[str, str, str]]:
    """(construct path, rule id, reason) of every acknowledgement recorded in the app's construct tree."""
    import aws_cdk as cdk

    key = cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    out = []
    for construct in synthesized.platform_app.app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == key:  # data: {"Annotation::<rule id>": reason}; cdk-nag strips the prefix
                for rule, reason in entry.data.items():
                    out.append((construct.node.path, rule.removeprefix("Annotation::"), reason))
    return out


@pytest.mark.parametrize("app", ["eks", "pcluster"])
def test_every_nag_acknowledgement_is_specific_and_reasoned(app: str, request: pytest.FixtureRequest) -> None:
    acks = [a for a in _acknowledgements(request.getfixturevalue(app)) if "AwsSolutions" in a[1]]
    print(f"{app}: {len(acks)} cdk-nag acknowledgements")
    for path, rule, reason in acks:
        print(f"  {rule} @ {path}: {reason}")
        assert rule.startswith("AwsSolutions-"), rule
        assert len(reason) >= 40, f"{rule} on {path}: reason too short"
        assert not any(word in reason.lower() for word in ("todo", "fixme", "n/a", "suppress")), reason
    rules = {rule for _, rule, _ in acks}
    if app == "eks":
        assert acks, "the EKS app is expected to acknowledge aws_eks_v2-internal findings"
    assert not any(r.endswith("IAM5[Action::s3:*]") for r in rules)
    # Resource '*' only where AWS allows nothing else: ecr:GetAuthorizationToken (no resource-level permissions;
    # the statement's action is checked in test_infra_pcluster), on the ECR pull policy alone
    star = [(path, reason) for path, rule, reason in acks if rule.endswith("IAM5[Resource::*]")]
    assert all("EcrPullPolicy" in path and "ecr:GetAuthorizationToken" in reason for path, reason in star), star


def test_cdk_nag_really_runs(tmp_path: Path) -> None:
    """Negative control: an unlogged, non-SSL bucket is reported through the same plugin wiring."""
    import aws_cdk as cdk
    from aws_cdk import aws_s3 as s3

    from stacks.nag import enable_aws_solutions_checks

    app = cdk.App(outdir=str(tmp_path))
    s3.Bucket(cdk.Stack(app, "Probe"), "Bucket")
    enable_aws_solutions_checks(app)
    with pytest.raises(Exception, match="ValidationFailed|Validation failed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules


def test_acknowledge_refuses_vague_reasons() -> None:
    import aws_cdk as cdk

    from stacks.nag import acknowledge

    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="specific reason"):
        acknowledge(stack, "AwsSolutions-IAM4", "needed")
