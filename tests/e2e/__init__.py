"""End-to-end tier: training runs, chaos scenarios, the Slurm lab, the Kubernetes contract emulator."""
