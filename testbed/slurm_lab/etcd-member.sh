#!/usr/bin/env bash
# etcd-member.sh: how the lab runs each etcd member (testbed/slurm_lab/etcd.py points T5_ETCD_BIN here): the real
# binary ($SLAB_ETCD_REAL_BIN) with the member's flags, plus one. The lab's three members share this host's network
# stack, so a member's connection to another comes from the bridge's primary address, not from the member's own,
# and etcd would refuse it for the source address missing from the peer certificate. They skip that one check;
# the peer certificate must still be signed by the cluster's CA (--peer-client-cert-auth). On the clusters every
# member has its own host and the check stays on.
exec "${SLAB_ETCD_REAL_BIN:?set by testbed/slurm_lab/etcd.py}" "$@" --experimental-peer-skip-client-san-verification
