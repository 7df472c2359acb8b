"""Tests of the CDK infrastructure that synthesize, lint or run scripts: synth, intent assertions, cfn-lint,
cdk-nag, pcluster schema (the ones that need none of it are in tests/unit/infra)."""
