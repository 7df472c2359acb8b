"""Slurm tools: ``python -m tools.slurm.submit``; thin wrappers over sbatch/scontrol/squeue."""
