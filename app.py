#!/usr/bin/env python3
"""CDK app: the GPU training platform (EKS or AWS ParallelCluster) plus shared network and storage.

Reads CDK context once into stacks.config.InfraConfig (validated: bad values fail here with the fix) and
synthesizes three stacks: <prefix>-network, <prefix>-storage and <prefix>-eks | <prefix>-pcluster.
cdk-nag AwsSolutions runs on every synth; an unacknowledged finding fails it.

Usage (through the pinned CDK CLI):  make synth PLATFORM=eks|parallelcluster [ARGS="-c key=value ..."]
                                     make deploy PLATFORM=eks|parallelcluster [ARGS="-c key=value ..."]
          (make deploy saves its -c settings in cdk.context.json, which every cdk command reads: docs/deploy.md)
          python app.py --help       list the context keys, their defaults and meaning
"""

from __future__ import annotations

import sys


def _print_help() -> None:
    from stacks.config import defaults, field_docs  # noqa: PLC0415 - keep --help free of CDK start-up

    print(__doc__)
    print('Context keys (cdk.json documents them under "//keys"; override with -c key=value):\n')
    dflt = defaults()
    for key, doc in field_docs().items():
        print(f"  {key} (default: {dflt[key]!r})\n      {doc}")


def main() -> int:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        _print_help()
        return 0
    import aws_cdk as cdk  # noqa: PLC0415

    from stacks.app_factory import build_stacks  # noqa: PLC0415
    from stacks.config import ConfigError, InfraConfig  # noqa: PLC0415

    app = cdk.App()
    try:
        InfraConfig.check_keys(app.node.get_all_context())
        config = InfraConfig.from_context(app.node.try_get_context)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    build_stacks(app, config)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
