"""Whether this machine can use AWS, asked once before ``make preflight``, ``make deploy`` and ``make destroy``.

    session = aws_session(saved_region)      # -c region / saved region, else AWS_REGION, else AWS_DEFAULT_REGION
    who = check_access(session, "make deploy")   # AwsAccessError: one line naming what is missing and the fix

Without this, an offline machine or a missing setting surfaced late and unclear: boto3 ignores ``AWS_REGION``
(which the CDK CLI, the AWS CLI v2 and the JavaScript SDK read), so preflight said "no AWS region" while it was
set; ``cdk deploy`` first ran ``npm ci`` (two minutes of registry retries offline), then synthesized, then said
"Unable to resolve AWS account" with nothing naming the network. One STS ``GetCallerIdentity`` call (no
permissions needed, ``CONNECT_S`` to connect, no retries) tells the four cases apart in seconds: no credentials,
no region, AWS unreachable, credentials refused.

``python -m stacks.aws_access COMMAND [ARGS...]`` runs the check for a make target (``COMMAND`` names it in the
message; ``-c region=...`` among ``ARGS`` and the saved settings' region are used as the deploy uses them): one
line with the account and region, exit 0; else one ``error:`` line, exit 1 (AWS could not be asked: the settings
are not at fault, the machine's access is).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: Seconds to connect to or hear from STS before AWS counts as unreachable from here.
CONNECT_S = 5
CREDENTIALS_FIX = "configure them (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
REGION_FIX = "set AWS_REGION, pass -c region=..., or configure a default region (aws configure)"


class AwsAccessError(RuntimeError):
    """AWS cannot be used from here (the message names what is missing and the fix)."""


@dataclass(frozen=True)
class Identity:
    """Who AWS says the credentials are, and where the calls go."""

    account: str
    arn: str
    region: str


def region_from_env(explicit: str | None = None) -> str | None:
    """The region the deploy uses: ``explicit`` (``-c region``, the saved settings), else ``AWS_REGION`` (the CDK
    CLI's and AWS CLI v2's variable, which boto3 does not read), else None (boto3's own: AWS_DEFAULT_REGION, the
    profile)."""
    return explicit or os.environ.get("AWS_REGION") or None


def aws_session(region: str | None = None) -> Any:
    """A boto3 session in :func:`region_from_env`'s region."""
    import boto3  # noqa: PLC0415 - boto3 is slow to import; callers check their own settings first

    chosen = region_from_env(region)
    return boto3.Session(region_name=chosen) if chosen else boto3.Session()


def missing_settings(session: Any) -> str | None:
    """What the session lacks to call AWS at all ("no AWS credentials", "no AWS region"), or None."""
    import botocore.exceptions  # noqa: PLC0415

    try:
        credentials = session.get_credentials()
    except botocore.exceptions.BotoCoreError:
        credentials = None
    if credentials is None:
        return "no AWS credentials"
    return None if session.region_name else "no AWS region"


def check_access(session: Any, command: str) -> Identity:
    """Who the credentials are (one STS call); :class:`AwsAccessError` when AWS cannot be used for ``command``."""
    import botocore.config  # noqa: PLC0415
    import botocore.exceptions as bx  # noqa: PLC0415

    missing = missing_settings(session)
    if missing:
        fix = CREDENTIALS_FIX if missing.endswith("credentials") else REGION_FIX
        raise AwsAccessError(f"{missing}: {fix}, then rerun {command}")
    config = botocore.config.Config(
        connect_timeout=CONNECT_S, read_timeout=CONNECT_S, retries={"max_attempts": 1, "mode": "standard"}
    )
    sts = session.client("sts", config=config)
    try:
        who = sts.get_caller_identity()
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError, bx.ProxyConnectionError) as e:
        raise AwsAccessError(
            f"AWS is unreachable from this machine ({sts.meta.endpoint_url}: {_reason(e)}): "
            f"{command} needs network access to AWS in {session.region_name}; check the network, "
            f"proxy (HTTPS_PROXY) or VPC endpoint, then rerun"
        ) from None
    except bx.ClientError as e:
        err = e.response.get("Error", {})
        raise AwsAccessError(
            f"AWS refused the credentials ({err.get('Code', '?')}: {err.get('Message', e)}): "
            f"{CREDENTIALS_FIX}, then rerun {command}"
        ) from None
    except bx.BotoCoreError as e:
        raise AwsAccessError(
            f"AWS could not be asked who the credentials are ({e}): {CREDENTIALS_FIX}, then rerun {command}"
        ) from None
    return Identity(account=who["Account"], arn=who["Arn"], region=session.region_name)


def _reason(e: Exception) -> str:
    """botocore's connection error without the URL it already repeats."""
    text = str(e)
    return "timed out" if "timeout" in text.lower() else "could not connect"


def _saved_region(argv: Sequence[str]) -> str | None:
    """``-c region=...`` among ``argv``, else the saved settings' region (what the deploy's stacks are bound to)."""
    from stacks.config import ConfigError  # noqa: PLC0415
    from stacks.deploy_config import load_saved  # noqa: PLC0415
    from stacks.synth_check import context_args  # noqa: PLC0415

    try:
        given = context_args(argv).get("region")
        return given or load_saved(Path.cwd()).get("region") or None
    except ConfigError:
        return None  # bad arguments: the command's own check names them


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not argv:
        print(
            "error: name the command the check is for: python -m stacks.aws_access 'make deploy' [ARGS...]",
            file=sys.stderr,
        )
        return 2
    command, rest = argv[0], argv[1:]
    try:
        who = check_access(aws_session(_saved_region(rest)), command)
    except AwsAccessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"[aws] account {who.account} in {who.region} ({who.arn})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
