"""``python -m training.launch.worker ARGS``: ``python -m training ARGS`` as this project's agent starts a cold worker
(``T5_WARM_WORKERS=0``; a warm one goes through :func:`training.launch.warm_workers.run_worker`): the commit fence's
etcd side installed first (:func:`training.launch.rendezvous.fence.install`), and ``failover.in_place``'s membership
board (:func:`training.launch.inplace_board.install`), which the training module's own rooms may not import."""

from __future__ import annotations

import sys

from training.launch import inplace_board
from training.launch.rendezvous.fence import install


def main() -> None:
    install()
    inplace_board.install()  # failover.in_place's membership board on the job's etcd (training.job.failover)
    from training.__main__ import main as train
    from training.job.lifecycle import exit_without_finalization

    exit_without_finalization(train(sys.argv[1:]))


if __name__ == "__main__":
    main()
