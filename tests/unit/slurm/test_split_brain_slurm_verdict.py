"""The Slurm split-brain scenario's own check, judged on given evidence (the job log's lines, Slurm's record): the
fenced nodes left the step and the job finished in its allocation; the same run without the node agent's exit-9
rule (srun killed the newer group, the job requeued) fails, and so does a run without the fault."""

from chaos.slurm import SlurmChaosConfig, scenarios
from chaos.slurm_split_brain import FENCED_NODE_LINE, FENCED_NODES_LEFT, agent_pid, check_fenced_nodes_left
from chaos.verdict import Observation


def node_line(node: str) -> str:
    return (
        f"1: [t5-node-agent {node}] the worker group of this node {FENCED_NODE_LINE}: the job goes on in that round; "
        "this node leaves the step"
    )


def observation(lines: list[str], requeues: int, state: str, stale=("n2", "n3")) -> Observation:
    facts = {"stale_nodes": list(stale), "spare_nodes": ["n1", "n4"], "requeues": requeues, "final_state": state}
    return Observation(records=[], faults=[], logs=[(5.0, x) for x in lines], facts=facts)


def test_the_fenced_nodes_leaving_and_the_job_completing_passes():
    c = check_fenced_nodes_left(observation(["0: step 6", node_line("n2"), node_line("n3")], 0, "COMPLETED"))
    assert c.name == FENCED_NODES_LEFT and c.ok, c.detail
    assert c.detail.startswith("2 node agent(s) left the step as fenced (the old group ran on ['n2', 'n3'])")


def test_srun_killing_the_step_and_a_requeue_fails():
    """Without the rule: the fenced agents' exit 9 makes srun --kill-on-bad-exit end the step, the job requeues."""
    c = check_fenced_nodes_left(
        observation(["0: step 6", "srun: error: n2: task 1: Exited with exit code 9"], 1, "COMPLETED")
    )
    assert not c.ok and "0 node agent(s)" in c.detail and "1 requeue(s)" in c.detail


def test_one_node_left_out_of_two_fails():
    assert not check_fenced_nodes_left(observation([node_line("n2")], 0, "COMPLETED")).ok


def test_a_failed_job_fails_even_with_the_lines():
    assert not check_fenced_nodes_left(observation([node_line("n2"), node_line("n3")], 0, "FAILED")).ok


def test_a_run_without_the_fault_fails():
    c = check_fenced_nodes_left(observation(["0: step 12"], 0, "COMPLETED", stale=()))
    assert not c.ok and "no node" in c.detail


def test_the_scenario_runs_a_spare_per_training_node_held_and_the_lab_grows_for_it():
    cfg = SlurmChaosConfig(scenarios="split-brain", nodes=2, spares=1)
    sc = scenarios(cfg)["split-brain"]
    assert sc.spares == 2 and sc.hold and cfg.lab_nodes == 4
    assert SlurmChaosConfig(scenarios="node-kill,worker-kill").lab_nodes == 3  # the other scenarios' lab is unchanged
    SlurmChaosConfig(scenarios="split-brain", spares=0).validate()  # its spares are its own: --spares 0 is fine


def test_no_agent_among_processes_that_are_gone():
    assert agent_pid({2**22 + 1}) is None
