"""training.launch.rdzv_poll: torch's 1 s rendezvous poll, scaled to the job's size; every other delay kept."""
from __future__ import annotations

from training.launch.rdzv_poll import STATE_READS_PER_S, apply_rdzv_poll, poll_s


def test_the_poll_keeps_the_store_load_bounded_and_never_exceeds_torchs_second():
    assert poll_s(1) == poll_s(2) == poll_s(20) == 0.1
    assert poll_s(128) == 128 / STATE_READS_PER_S == 0.64
    assert poll_s(200) == poll_s(5000) == 1.0


def test_only_the_state_poll_is_shortened_and_applying_twice_does_not_stack(monkeypatch):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous import utils

    monkeypatch.setattr(dr, "_delay", dr._delay)  # restored after the test
    monkeypatch.setattr(dr._BackendRendezvousStateHolder, "__init__", dr._BackendRendezvousStateHolder.__init__)
    slept: list[float] = []

    class _Time:
        @staticmethod
        def sleep(s):
            slept.append(s)

    monkeypatch.setattr(utils, "time", _Time)
    monkeypatch.setattr(utils.random, "uniform", lambda a, b: b)
    original_delay, original_init = dr._delay, dr._BackendRendezvousStateHolder.__init__
    assert apply_rdzv_poll(4) == 0.1 and apply_rdzv_poll(128) == 0.64
    # one layer over torch's own functions, not a wrapper around the first application
    assert dr._delay.__wrapped__ is original_delay
    assert dr._BackendRendezvousStateHolder.__init__.__wrapped__ is original_init
    dr._delay(seconds=1)           # the poll while waiting for other nodes
    dr._delay(seconds=(0, 0.3))    # torch's random skew before the first round
    dr._delay(seconds=2)
    assert slept == [0.64, 0.3, 2]


def test_a_real_c10d_handler_reads_its_state_at_the_scaled_poll(monkeypatch):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    monkeypatch.setattr(dr, "_delay", dr._delay)
    monkeypatch.setattr(dr._BackendRendezvousStateHolder, "__init__", dr._BackendRendezvousStateHolder.__init__)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{server.port}", run_id="poll", min_nodes=1,
                                  max_nodes=2, is_host=False)

    def holder_cache_s() -> float:
        backend, store = create_backend(params)
        return dr.create_handler(store, backend, params)._state_holder._cache_duration

    assert holder_cache_s() == 1  # torch's: a waiting agent sees the others at most once a second
    apply_rdzv_poll(2)
    assert holder_cache_s() == 0.1
