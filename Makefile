# Thin index over scripts/; every target passes ARGS="..." through to its script.
# Variables read by the scripts: PLATFORM (local|slurm|eks), PRESET, NPROC, NODES, DRY_RUN.
export PLATFORM PRESET NPROC NODES DRY_RUN
SHELL := /bin/bash

.PHONY: help venv train test bench chaos-test synth slurm-up slurm-down image
help:            ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
venv:            ## create/reuse the project venv with pinned deps
	@scripts/venv.sh >/dev/null
train:           ## run the FSDP T5 job (local CPU by default; PLATFORM=slurm|eks to submit)
	@scripts/train.sh $(ARGS)
test:            ## run the whole test suite (unit + e2e)
	@scripts/test.sh $(ARGS)
bench:           ## throughput and checkpoint-stall benchmark (prints a table, writes JSON)
	@scripts/bench.sh $(ARGS)
chaos-test:      ## kill workers/nodes mid-training and prove nothing is lost
	@scripts/chaos.sh $(ARGS)
synth:           ## cdk synth offline for PLATFORM=eks|parallelcluster
	@scripts/synth.sh $(ARGS)
slurm-up:        ## start the local test Slurm cluster
	@scripts/slurm_lab.sh up $(ARGS)
slurm-down:      ## stop the local test Slurm cluster
	@scripts/slurm_lab.sh down $(ARGS)
image:           ## build and push the training image to the stack's ECR repo (needs Docker + AWS)
	@scripts/image.sh $(ARGS)
