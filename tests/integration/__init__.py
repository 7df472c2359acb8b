"""Integration tier: real local services and processes (etcd, shell scripts, cdk synth, make targets)."""
