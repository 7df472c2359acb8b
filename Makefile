# Thin index over scripts/; every target passes ARGS="..." through to its script.
# Variables the scripts read (`make help` prints this table from the lines starting with "#>"):
#> PLATFORM  local      where train/status/chaos-test run: local, slurm (= parallelcluster) or eks; synth, preflight, deploy, destroy: eks (their default) or parallelcluster
#> PRESET    debug      training preset (training/presets/*.toml); PLATFORM=eks defaults to t5-base
#> NPROC     2          processes per node; local chaos-test: 1; slurm/eks: one per GPU of the instance type
#> NODES     1          nodes; local train: NODES>1 simulates that many here; chaos-test, slurm, eks: 2 (the default deploy's GPU nodes)
#> SPARES    0          hot-spare nodes beyond NODES (local simulated, extra Slurm nodes, or extra EKS pods): they replace a lost node, the world size stays; local chaos-test: the soak's (SOAK; default 1), its scenarios choose their own; PLATFORM=slurm chaos-test: per job (default 1)
#> MAX_RESTARTS 3       local train (one node): worker-group restarts from the in-memory snapshot before the run fails
#> SOAK      (off)      chaos-test: a goodput soak of this length (e.g. 10m) with one random fault per minute, instead of the scenarios
#> ARGS      (none)     extra arguments for the target's script, e.g. ARGS="--train.steps 200" (scripts/<script> --help)
#> DRY_RUN   (off)      1/true/yes/on: print what train, chaos-test, image, deploy or destroy would do, run nothing; 0/false/no/off/empty: run
#> IMAGE_TAG (content)  image tag for image and train PLATFORM=eks; default: this checkout's src-<digest> (tools/image_tag.py)
#> TEST_WORKERS 3       test, test-unit, test-fast: pytest-xdist workers the suite runs on (0: one test at a time, in one process)
export PLATFORM PRESET NPROC NODES SPARES MAX_RESTARTS SOAK DRY_RUN IMAGE_TAG TEST_WORKERS
SHELL := /bin/bash

.PHONY: help venv train status test test-unit test-fast lint bench chaos-test synth slurm-up slurm-down image preflight deploy destroy
help:            ## list targets and the variables they read
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
	@echo
	@echo "Variables (make TARGET NAME=value; defaults in the second column):"
	@sed -n 's/^#> /  /p' $(MAKEFILE_LIST)
venv:            ## create/reuse the project venv with pinned deps
	@scripts/venv.sh >/dev/null
train:           ## run the FSDP T5 job (local CPU by default; PLATFORM=slurm|eks to submit)
	@scripts/train.sh $(ARGS) || scripts/train_exit.sh train $$?
status:          ## one screen for the running or last job: step, ETA, tokens/s, world, last failure, goodput
	@scripts/status.sh $(ARGS)
test:            ## run the whole test suite: tests/unit, tests/integration, tests/e2e (what CI runs; ~25 min on 2 cores)
	@scripts/test.sh $(ARGS)
test-unit:       ## the unit tier only (tests/unit: no process, no socket; about a minute)
	@scripts/test.sh --tier unit $(ARGS)
test-fast:       ## the unit and integration tiers (no training run, chaos, Slurm lab or k8s emulator)
	@scripts/test.sh --tier unit --tier integration $(ARGS)
lint:            ## ruff check + format (pyproject.toml) and shellcheck over scripts/; CI runs it before the tests
	@scripts/lint.sh $(ARGS)
bench:           ## throughput and checkpoint-stall benchmark (prints a table, writes JSON)
	@scripts/bench.sh $(ARGS)
chaos-test:      ## kill workers/nodes mid-training and prove nothing is lost
	@scripts/chaos.sh $(ARGS) || scripts/train_exit.sh chaos-test $$?
synth:           ## cdk synth offline for PLATFORM=eks|parallelcluster
	@scripts/synth.sh $(ARGS)
slurm-up:        ## start the local test Slurm cluster
	@scripts/slurm_lab.sh up $(ARGS)
slurm-down:      ## stop the local test Slurm cluster
	@scripts/slurm_lab.sh down $(ARGS)
image:           ## build and push the training image to the stack's ECR repo (needs Docker + AWS)
	@scripts/image.sh $(ARGS)
preflight:       ## check GPU quota, AZ offer and capacity reservation (read-only AWS calls); saves the AZ
	@scripts/venv.sh >/dev/null && .venv/bin/python -m stacks.preflight $(ARGS)
deploy:          ## cdk deploy PLATFORM=eks|parallelcluster; ARGS="-c key=value" are saved (cdk.context.json) for redeploys
	@scripts/deploy.sh $(ARGS)
destroy:         ## cdk destroy PLATFORM=eks|parallelcluster (ARGS="--cluster-only" keeps storage + network)
	@scripts/destroy.sh $(ARGS)
