"""In-process recovery (issue #52, docs/inprocess.md): a surviving rank keeps its process and its tensors, agrees the
new membership and the step to resume at through the membership store, and builds a new process group.

:mod:`.agreement` is the protocol over a small store abstraction (no torch); :mod:`.group` drives torch's process
group with it; :mod:`.sockets` finds and shuts down a group's connections, which cuts a collective blocked on a
silent peer (no torch). The etcd implementation of the store lives with the launcher
(``training.launch.inplace_board``): this package imports nothing from ``training.launch``. The trainer uses it
through :mod:`training.job.failover` (``failover.in_place``).
"""
