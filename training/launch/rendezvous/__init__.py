"""Membership on etcd: torchrun's rendezvous as a handler registered through torch's public registry.

* :mod:`.handler`: ``--rdzv-backend=t5-etcd`` (leases, one watch, rounds, the round's store), composed of
  :mod:`.membership`, :mod:`.head_view`, :mod:`.joining`, :mod:`.closer`, :mod:`.round_store`, :mod:`.ending`,
  :mod:`.watched`, :mod:`.layout` and :mod:`.dead_agent` (a node whose agent is dead taken out at once);
* :mod:`.rounds`: what an agent does next, as pure functions of the round record and the live members;
* :mod:`.client`: etcd's v3 API as JSON over HTTPS, failing over between members;
* :mod:`.members`: a local 3-member etcd with TLS and auth (local runs, the tests);
* :mod:`.member_repair`: a member that lost its data rejoins at its own start (local, EKS, ParallelCluster);
* :mod:`.certs`: its CA and certificates;
* :mod:`.fence`: the commit fence's etcd side, in the workers (is this group's round still the newest?).
"""
