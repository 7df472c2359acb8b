"""Validate ParallelCluster cluster configurations with the real aws-parallelcluster schema.

Runs ONLY inside the dedicated ``.venv-pcluster`` (aws-parallelcluster installs CDK v1 into the same
``aws_cdk`` package as the project's CDK v2, so it cannot share the project venv). Standard library plus
``pcluster``; no project imports.

    .venv-pcluster/bin/python cluster_assets/parallelcluster/validate.py CONFIG.json|yaml [...]

Prints ``OK <file>`` or ``INVALID <file>: <errors as JSON>`` per file; exit 0 when all are valid, 1 if any
is invalid, 2 on usage errors. No AWS calls are made (IMDS is disabled, a placeholder region is set):
the schema checks keys, types, enums and ID formats, not cross-resource rules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="cluster config files (.json, .yaml)")
    parser.add_argument("--cluster-name", default="t5ft-slurm", help="name passed to the schema")
    args = parser.parse_args(argv)

    # Never reach AWS: no instance metadata, a placeholder region for the region-dependent defaults.
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import yaml  # noqa: PLC0415 - installed with aws-parallelcluster
    from marshmallow import ValidationError  # noqa: PLC0415
    from pcluster.schemas.cluster_schema import ClusterSchema  # noqa: PLC0415

    failed = 0
    for path in args.configs:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
        except (OSError, ValueError) as e:
            print(f"cannot read {path}: {e}", file=sys.stderr)
            return 2
        try:
            ClusterSchema(cluster_name=args.cluster_name).load(data)
        except ValidationError as e:
            failed += 1
            print(f"INVALID {path}: {json.dumps(e.messages, sort_keys=True, default=str)}")
        else:
            print(f"OK {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
