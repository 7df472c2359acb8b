"""The NCCL/libfabric environment of GPU training processes, the same on EKS and on Slurm.

Target stack: the EFA installer's libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (the PyTorch DLC the image
builds on and current ParallelCluster AMIs ship far newer ones). Most historical EFA variables are then
handled by the plugin itself, and setting them by hand only pins old behaviour (AWS's EFA cheatsheet in
awsome-distributed-training, and aws-ofi-nccl's ``platform-aws``). Deliberately NOT set:

* ``FI_PROVIDER=efa``: the plugin restricts libfabric to the EFA provider itself (needed only <= 1.5).
* ``NCCL_PROTO=simple``: the plugin forces Simple itself where EFA cannot guarantee 128-byte delivery order
  (p4d) and keeps LL/LL128 where it can (p5, p5en); forcing it costs small-message latency on p5.
* ``FI_EFA_FORK_SAFE=1``: the plugin sets it on every NVIDIA platform, and libfabric ignores it on kernels
  >= 5.13 with rdma-core >= 38 (copy-on-fork for pinned memory).
* ``NCCL_NET_PLUGIN=ofi``: NCCL then looks for ``libnccl-net-ofi.so``, which only aws-ofi-nccl >= 1.14
  installs, and quietly falls back to TCP sockets without it; the default ``libnccl-net.so`` exists in every
  release.
* ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``: torch's default (3) already ends the process when a collective
  fails or times out; 1 first calls ``ncclCommAbort``, which can hang and turn a fast failure into a stuck pod.
"""

from __future__ import annotations

# Where EFA hosts keep libfabric and the aws-ofi-nccl plugin (libnccl-net.so): the EFA installer's layout differs
# by OS and release (lib64 on Amazon Linux/RHEL, lib on Ubuntu, lib/<arch>-linux-gnu for ofi-nccl before
# installer 1.44, lib64 from 1.44 on), and older ParallelCluster AMIs built the plugin in /opt/aws-ofi-nccl. A job
# outside the image puts the ones that exist on LD_LIBRARY_PATH; the installer's ld.so.conf.d entries usually
# make that redundant, and NCCL falls back to TCP sockets, silently, where neither finds the plugin.
EFA_LIBRARY_DIRS = (
    "/opt/amazon/efa/lib64",
    "/opt/amazon/efa/lib",
    "/opt/amazon/ofi-nccl/lib64",
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu",
    "/opt/aws-ofi-nccl/lib",
)
# The plugin NCCL loads when NCCL_NET_PLUGIN is unset; aws-ofi-nccl >= 1.15 names it libnccl-net-ofi.so and
# keeps this name beside it.
NCCL_NET_PLUGIN_LIBRARY = "libnccl-net.so"


def nccl_env(*, efa: bool, gpudirect_rdma: bool = False) -> dict[str, str]:
    """Environment for every process of a GPU training job (not for CPU jobs: there is no NCCL there).

    Args:
        efa: the nodes have EFA interfaces attached (the aws-ofi-nccl plugin carries NCCL's traffic).
        gpudirect_rdma: their EFA supports GPUDirect RDMA (:attr:`GpuInstanceSpec.gpudirect_rdma`).
    """
    if gpudirect_rdma and not efa:
        raise ValueError("gpudirect_rdma needs efa: GPUDirect RDMA is a feature of EFA")
    env = {
        # NCCL prints nothing when unset: a failed collective should name its cause in the job log.
        "NCCL_DEBUG": "WARN",
        # Bootstrap and socket traffic on the node's (pod's) primary interface, never loopback or a container
        # bridge that other nodes cannot reach.
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
    }
    if efa:
        # Data-loader workers fork after EFA memory is registered; with libfabric's huge-page buffers fork()
        # fails with ENOMEM once the node's huge pages run out. Costs a little bandwidth.
        env["FI_EFA_USE_HUGE_PAGE"] = "0"
    if gpudirect_rdma:
        # GPU memory straight to the NIC. libfabric >= 1.18 turns it on by itself where the device supports it;
        # explicit for older images and AMIs, and only on types that support it (libfabric fails otherwise).
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env
