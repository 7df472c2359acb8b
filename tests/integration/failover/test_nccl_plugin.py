"""The launcher's warning for an EFA node whose NCCL network plugin does not load (NCCL would fall back to TCP
sockets without a word). The loader is the real one: a real shared library stands in for the plugin."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cluster_facts import NCCL_NET_PLUGIN_LIBRARY
from training.launch.nccl_plugin import load_error, missing_plugin_warning, plugin_library, rdma_devices

A_LIBRARY = next(
    (
        p
        for p in (
            "/lib/x86_64-linux-gnu/libz.so.1",
            "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "/lib64/libz.so.1",
            "/lib/aarch64-linux-gnu/libz.so.1",
        )
        if os.path.exists(p)
    ),
    None,
)


@pytest.fixture
def efa_node(tmp_path) -> Path:
    """A device directory as an EFA node shows it (the files' contents do not matter; their names do)."""
    devices = tmp_path / "infiniband"
    devices.mkdir()
    for name in ("uverbs0", "uverbs1", "rdma_cm"):
        (devices / name).touch()
    return devices


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NCCL_NET_PLUGIN")}
    return {**env, **extra}


def test_an_efa_node_without_the_plugin_gets_a_warning_naming_the_loader_and_the_fix(efa_node):
    assert rdma_devices(str(efa_node)) == [str(efa_node / "uverbs0"), str(efa_node / "uverbs1")]
    warning = missing_plugin_warning(str(efa_node), env_with())
    assert warning.startswith(
        f"warning: this node has 2 RDMA device(s) ({efa_node / 'uverbs0'}, ...) but NCCL's "
        f"network plugin does not load ({NCCL_NET_PLUGIN_LIBRARY}: cannot open shared object "
        "file: No such file or directory): NCCL will carry the traffic between nodes over TCP"
    )
    assert "Fix: put the aws-ofi-nccl library directory on LD_LIBRARY_PATH (" in warning
    assert "/opt/amazon/ofi-nccl/lib64" in warning


@pytest.mark.skipif(A_LIBRARY is None, reason="no libz.so.1 to stand in for the plugin")
def test_a_plugin_the_loader_finds_or_a_node_without_rdma_gets_no_warning(efa_node, tmp_path):
    plugin_dir = tmp_path / "ofi-nccl"
    plugin_dir.mkdir()
    shutil.copy(A_LIBRARY, plugin_dir / NCCL_NET_PLUGIN_LIBRARY)
    assert missing_plugin_warning(str(efa_node), env_with(LD_LIBRARY_PATH=str(plugin_dir))) is None
    assert load_error(NCCL_NET_PLUGIN_LIBRARY, env_with(LD_LIBRARY_PATH=str(plugin_dir))) is None
    # no RDMA device: nothing to warn about, plugin or not
    assert missing_plugin_warning(str(tmp_path / "no-devices"), env_with()) is None
    # NCCL_NET_PLUGIN picks another file name, which this directory lacks; "none" turns plugins off
    ofi = env_with(LD_LIBRARY_PATH=str(plugin_dir), NCCL_NET_PLUGIN="ofi")
    assert plugin_library(ofi) == "libnccl-net-ofi.so"
    assert "(libnccl-net-ofi.so: cannot open shared object file" in missing_plugin_warning(str(efa_node), ofi)
    assert missing_plugin_warning(str(efa_node), env_with(NCCL_NET_PLUGIN="none")) is None
    assert plugin_library({"NCCL_NET_PLUGIN": "/opt/x/libnccl-net-aws.so"}) == "/opt/x/libnccl-net-aws.so"


def test_a_file_that_is_not_a_library_is_reported_as_the_loader_sees_it(efa_node, tmp_path):
    plugin_dir = tmp_path / "broken"
    plugin_dir.mkdir()
    # e.g. a text file or an HTML error page saved under its name
    (plugin_dir / NCCL_NET_PLUGIN_LIBRARY).write_text("not an ELF file\n" * 20)
    warning = missing_plugin_warning(str(efa_node), env_with(LD_LIBRARY_PATH=str(plugin_dir)))
    assert f"({plugin_dir / NCCL_NET_PLUGIN_LIBRARY}: invalid ELF header)" in warning
