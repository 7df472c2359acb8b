"""The test suite, in three tiers by folder (tests/conftest.py marks each test with its tier):

tests/unit/         pure functions and in-process objects: no process, no socket, no etcd, no CDK synth (its conftest
                    makes a test that starts a process or opens a socket fail); the whole tier runs in about a minute
tests/integration/  real local services and processes: etcd, the shell scripts, `cdk synth`, make targets
tests/e2e/          training runs, chaos scenarios, the Slurm lab, the Kubernetes contract emulator
tests/support/      helpers the tiers share (imported as tests.support.<module>; the probes run as scripts)

Inside a tier the folders are areas (training, failover, infra, k8s, slurm, scripts, ...). A package, so that two tiers
may each hold a file of the same name (a file split by tier keeps its name in each).
"""
