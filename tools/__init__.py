"""Host-side command-line tools: submit jobs to Slurm and EKS, talk to the Kubernetes API and slurmctld."""
