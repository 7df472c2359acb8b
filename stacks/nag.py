"""cdk-nag (AwsSolutions) wiring and acknowledgements.

Every acknowledgement names one finding (cdk-nag 3 ids are per finding, e.g. ``AwsSolutions-IAM5[Resource::*]``)
and carries a reason specific to this project; :func:`acknowledge` refuses short or generic reasons.
"""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

_MIN_REASON = 40


def enable_aws_solutions_checks(app: cdk.App) -> None:
    """Run the AwsSolutions pack at synth; any unacknowledged finding fails synthesis."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding on ``scope`` (and its children) with a specific written reason."""
    if len(reason.strip()) < _MIN_REASON:
        raise ValueError(f"acknowledgement of {finding} needs a specific reason (>= {_MIN_REASON} chars)")
    if not finding.startswith("AwsSolutions-"):
        raise ValueError(f"{finding}: expected an AwsSolutions rule id")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))
