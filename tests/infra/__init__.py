"""Tests of the CDK infrastructure (tests/infra): synth, intent assertions, cfn-lint, cdk-nag, pcluster schema."""
