"""The micro-batch chosen from measured memory (issue 51, lever 5): the line through the peaks, what fits, and the
failover rule (it divides every planned world's share: a job that loses nodes runs more micro-batches of the same
size, never larger ones). Bad input is one line naming the value and the fix."""

from __future__ import annotations

import pytest

from training.job.micro_batch_fit import FitError, JobPlan, MemoryLine, choose, fit_line, micro_batch_warnings

# The GPU presets' plan: global batch 256 on 2 nodes x 8 GPUs, kept training down to 1 node (the launcher's default)
PRESET_PLAN = JobPlan(global_batch=256, min_nodes=1, max_nodes=2, nproc_per_node=8)


def micro_batch_sizes(share: int, micro: int) -> list[int]:
    """The sizes the trainer's ``ids.split(micro)`` gives a rank's share (training/job/trainer.py)."""
    return [min(micro, share - i) for i in range(0, share, micro)]


def test_the_line_through_measured_peaks_and_the_most_samples_that_fit():
    line = fit_line({2: 14.0, 4: 16.5, 8: 21.5})  # 11.5 GB + 1.25 GB per sample
    assert line.fixed_gb == pytest.approx(11.5) and line.per_sample_gb == pytest.approx(1.25)
    assert line.peak_gb(32) == pytest.approx(51.5)
    # 140 GB with 10% kept free: (126 - 11.5) / 1.25 = 91.6 -> 91 samples
    assert line.largest_fitting(140.0, 0.1) == 91
    assert line.largest_fitting(12.0, 0.0) == 0  # the state alone nearly fills it: not one sample
    # least squares over noisy peaks, two points enough
    assert fit_line({2: 14.1, 4: 16.4, 8: 21.5}).per_sample_gb == pytest.approx(1.2393, abs=1e-4)
    assert fit_line({4: 20.0, 8: 30.0}) == MemoryLine(fixed_gb=10.0, per_sample_gb=2.5)


def test_a_gpu_with_room_for_more_keeps_the_share_of_the_full_world():
    choice = choose(PRESET_PLAN, fitting=91)
    assert choice.micro_batch == 16  # the share at 16 ranks, not the 32 of the smallest world (8 ranks)
    assert choice.micro_batches_per_step() == {16: 1, 8: 2}
    assert "the GPU has room for 91 but a rank's share at the full world is 16" in choice.line()
    assert "train.global_batch" in choice.line()
    # one GPU at batch 32 (bench_gpu.sh's row): the whole share in one forward when it fits, else half
    one_gpu = JobPlan(global_batch=32, min_nodes=1, max_nodes=1, nproc_per_node=1)
    assert choose(one_gpu, fitting=91).micro_batch == 32
    assert choose(one_gpu, fitting=20).micro_batch == 16


def test_survivors_run_more_micro_batches_of_the_same_size_never_larger_ones():
    """At every planned world each micro-batch is exactly the chosen size, and it fits: losing nodes only adds
    micro-batches. Here the shares (48, 32, 24) do not divide one another, so the largest world's share is not
    enough: the choice must divide each."""
    plan = JobPlan(global_batch=96, min_nodes=2, max_nodes=4, nproc_per_node=1)
    for fitting in range(1, 100):
        choice = choose(plan, fitting)
        assert choice.shares == {4: 24, 3: 32, 2: 48}
        assert 1 <= choice.micro_batch <= fitting
        for share in choice.shares.values():
            assert set(micro_batch_sizes(share, choice.micro_batch)) == {choice.micro_batch}, (fitting, share)
        assert choice.micro_batch == max(d for d in (1, 2, 4, 8) if d <= fitting)  # the divisors of gcd(24, 32, 48)


def test_the_preset_plan_at_every_fit_never_raises_a_survivors_micro_batch():
    for fitting in range(1, 200):
        choice = choose(PRESET_PLAN, fitting)
        full, smallest = choice.shares[16], choice.shares[8]
        assert max(micro_batch_sizes(smallest, choice.micro_batch)) == max(micro_batch_sizes(full, choice.micro_batch))


@pytest.mark.parametrize(
    "peaks, says",
    [
        ({4: 20.0}, "peaks measured at [4]: a line needs two micro-batch sizes or more; e.g. --probe 2 4 8"),
        ({2: 20.0, 4: 20.0}, "the peaks do not grow with the micro-batch (2: 20.00 GB, 4: 20.00 GB)"),
        ({0: 10.0, 4: 20.0}, "micro-batch sizes [0] are not whole numbers >= 1"),
    ],
)
def test_peaks_no_line_can_come_from_are_one_line(peaks, says):
    with pytest.raises(FitError, match=None) as e:
        fit_line(peaks)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_bad_plans_and_limits_are_one_line_naming_the_value_and_the_fix():
    cases = [
        (
            lambda: JobPlan(100, 1, 2, 8).check(),
            "train.global_batch=100 does not divide by the planned world sizes [16, 8]",
        ),
        (
            lambda: JobPlan(128, 1, 3, 8).check(),
            "[24] (1..3 nodes x 8): use a multiple of 48 (e.g. --train.global_batch 144)",
        ),
        (lambda: JobPlan(256, 3, 2, 8).check(), "--min-nodes 3 > --nodes 2: lower --min-nodes"),
        (lambda: JobPlan(256, 1, 2, 0).check(), "--nproc-per-node 0 must be >= 1"),
        (lambda: choose(PRESET_PLAN, 0), "not even one sample per forward/backward fits"),
        (lambda: MemoryLine(10.0, 1.0).largest_fitting(140.0, 1.0), "headroom 1.0 must be in [0, 1)"),
        (lambda: MemoryLine(10.0, 1.0).largest_fitting(0.0, 0.1), "GPU capacity 0.0 GB must be > 0"),
    ]
    for call, says in cases:
        with pytest.raises(FitError) as e:
            call()
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_micro_batch_set_by_hand_is_warned_when_survivors_would_run_larger_or_ragged_ones():
    shares = PRESET_PLAN.shares()  # {16: 16, 8: 32}
    assert micro_batch_warnings(16, shares) == micro_batch_warnings(8, shares) == micro_batch_warnings(0, shares) == []
    larger = micro_batch_warnings(32, shares)
    assert larger == [
        "train.micro_batch=32 is above the per-rank share at 16 ranks (16): after losing nodes a rank puts up to 32 "
        "samples through a forward/backward, more GPU memory than the full-size job used; use a divisor of 16 "
        "(python -m training.batch_fit picks one from measured memory)"
    ]
    ragged = micro_batch_warnings(16, {4: 24, 3: 32, 2: 48})
    assert ragged == [
        "train.micro_batch=16 does not divide the per-rank share at world sizes [4] (24): a step's last micro-batch "
        "is smaller there (another shape, compiled again with parallel.compile on); use a divisor of 8"
    ]
    assert len(micro_batch_warnings(12, shares)) == 1 and len(micro_batch_warnings(24, shares)) == 2
