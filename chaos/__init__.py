"""Chaos tests: break a running training job on purpose and prove it recovers with nothing lost.

The core is the same for every platform: ``catalog`` (scenario names), ``scenario`` (the entry each harness
tables per scenario: how it injects the fault, what the verdict expects, the checks it adds), ``analysis``
(arithmetic over a job's metrics.jsonl), ``verdict`` (the checks, each with its evidence) and ``report`` (table,
report.json, PNG). The harnesses only start jobs, inject faults and collect what happened: ``python -m chaos.local``
(simulated nodes here, ``make chaos-test``), ``python -m chaos.slurm`` (a Slurm cluster), ``python -m chaos.eks`` (a
live EKS cluster; ``kubernetes`` holds the pod verdict it shares with the contract emulator). See docs/failover.md.
"""
