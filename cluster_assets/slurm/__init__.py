"""Slurm path: the local test cluster (lab/), the batch-script renderer and the chaos harness."""
