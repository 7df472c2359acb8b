"""The docs' example commands line up with what the stack deploys and what the scripts do.

Extracted from README.md and docs/*.md (and the submit CLIs' own help), checked against the synthesized default
EKS app and cluster_facts: the ECR repository and image URIs, the image tag `make image` pushes, node counts
that fit the default deployment, the way onto the ParallelCluster head node, the Node.js versions, and that
nothing cites a file the repository does not have.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from cluster_facts import image_repository
from stacks.config import InfraConfig
from tests.support.infra import ROOT, Synthesized, resources_of_type
from tools.image_tag import TAG_PATTERN

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Help texts a user reads as docs (module docstrings printed by --help).
HELP = [
    ROOT / "tools" / "slurm" / "submit.py",
    ROOT / "tools" / "k8s" / "submit.py",
    ROOT / "cluster_assets" / "slurm" / "render.py",
]
ECR_URI = re.compile(
    r"\b\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/"
    r"([a-z0-9][\w./-]*?)(?::([\w.-]+))?(?=[\s\"'`)]|$)"
)
#: A command that runs on a deployed cluster (the local lab and simulated nodes are not bound by gpuNodes).
CLUSTER_COMMAND = re.compile(
    r"make (?:train|chaos-test) PLATFORM=(?:slurm|eks)|tools\.(?:slurm|k8s)\.submit|"
    r"cluster_assets\.slurm\.render|scripts/(?:train|chaos)_(?:slurm|eks)\.sh"
)


def text_of(paths: list[Path]) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def test_image_uris_name_the_stacks_repository_and_a_tag_make_image_pushes(eks: Synthesized) -> None:
    (repo,) = [
        r["Properties"]["RepositoryName"]
        for _, r in resources_of_type(eks.templates["Storage"], "AWS::ECR::Repository")
    ]
    assert repo == image_repository(InfraConfig().name_prefix) == "t5ft/t5-train"
    uris = [(name, m) for name, text in text_of(DOCS + HELP).items() for m in ECR_URI.finditer(text)]
    assert len(uris) >= 3, "the docs show the image URI in the EKS and Slurm examples"
    for name, m in uris:
        assert m.group(1) == repo, f"{name}: {m.group(0)} is not in the stack's ECR repository {repo}"
        assert m.group(2) and TAG_PATTERN.fullmatch(m.group(2)), (
            f"{name}: {m.group(0)}: `make image` pushes tags like src-<12 hex> (tools/image_tag.py)"
        )
    for name, text in text_of(DOCS).items():
        for m in re.finditer(r"--repository-name (\S+?)[`\s]", text):
            assert m.group(1) == repo, f"{name}: --repository-name {m.group(1)} is not {repo}"


def test_cluster_examples_fit_the_default_deployment(eks: Synthesized) -> None:
    (gpu,) = [
        r
        for _, r in resources_of_type(eks.templates["Eks"], "AWS::EKS::Nodegroup")
        if r["Properties"]["AmiType"].endswith("NVIDIA")
    ]
    nodes = gpu["Properties"]["ScalingConfig"]["MaxSize"]
    assert nodes == InfraConfig().gpu_nodes == 2
    checked = 0
    for name, text in text_of(DOCS + HELP).items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            command = line + (lines[i + 1] if line.rstrip().endswith("\\") and i + 1 < len(lines) else "")
            if not CLUSTER_COMMAND.search(command) or "gpuNodes" in command:
                continue  # a line that says it needs a bigger deployment is fine
            for m in re.finditer(r"\bNODES=(\d+)|--nodes[ =](\d+)", command):
                checked += 1
                asked = int(m.group(1) or m.group(2))
                assert asked <= nodes, (
                    f"{name}:{i + 1}: {m.group(0)} needs more than the default {nodes} GPU "
                    f"nodes: use {nodes}, or say the deploy needs -c gpuNodes={asked}"
                )
        for m in re.finditer(r"```toml\n(.*?)```", text, flags=re.S):
            for n in re.findall(r"^nodes = (\d+)$", m.group(1), flags=re.M):
                checked += 1
                assert int(n) <= nodes, f"{name}: TOML example nodes = {n} > the default {nodes} GPU nodes"
    assert checked >= 4


def test_head_node_access_is_what_the_stack_sets_up(pcluster: Synthesized) -> None:
    outputs = pcluster.templates["ParallelCluster"]["Outputs"]
    command = outputs["HeadNodeSessionCommand"]["Value"]
    assert "aws ssm start-session --target" in str(command)
    docs = text_of(DOCS + HELP + [ROOT / "tools" / "slurm" / "slurmctl.py"])
    for name in ("docs/slurm.md", "docs/deploy.md", "tools/slurm/slurmctl.py"):
        assert "HeadNodeSessionCommand" in docs[name], f"{name} must send users to the SSM session command"
    for name, text in docs.items():
        for paragraph in re.split(r"\n\s*\n", text):
            if "pcluster ssh" in paragraph:
                assert "sshKeyName" in paragraph, (
                    f"{name}: `pcluster ssh` needs a key the default deploy does not set (say sshKeyName there)"
                )


def test_node_version_is_stated_as_synth_checks_it() -> None:
    readme = (ROOT / "README.md").read_text()
    cdk_lib = (ROOT / "scripts" / "cdk_lib.sh").read_text()  # synth, deploy and destroy all run its check
    assert '"$node_major" -lt 22' in cdk_lib and "Node 22 or 24" in cdk_lib
    for script in ("synth.sh", "deploy.sh", "destroy.sh"):
        assert "cdk_cli_ready" in (ROOT / "scripts" / script).read_text(), script
    assert "Node.js 22 or 24 for `make synth`" in readme
    assert not re.search(r"Node 20 for", readme)
    engines = ROOT / "node_modules" / "aws-cdk" / "package.json"
    if engines.is_file():  # the pinned CLI's own requirement, as the README quotes it
        assert '"node": ">= 18.0.0"' in engines.read_text() and "accepts Node >= 18" in readme


def test_nothing_cites_a_file_the_repository_does_not_have() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    problems = []
    for rel in tracked:
        path = ROOT / rel
        if path.suffix not in (".py", ".sh", ".md", ".toml", ".in", ".json", "") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "NOTES" in text and rel != "tests/integration/infra/test_infra_docs.py":
            problems += [f"{rel}: cites {m}" for m in re.findall(r"[\w./-]*NOTES[\w.-]*", text)]
        for doc in re.findall(r"\bdocs/[\w-]+\.md", text):
            if not (ROOT / doc).is_file():
                problems.append(f"{rel}: cites {doc}, which does not exist")
    assert not problems, "\n".join(problems)
