"""Test infrastructure: the Kubernetes contract emulator and the local Slurm lab (never shipped to clusters)."""
