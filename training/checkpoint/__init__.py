"""Checkpoints: the two tiers and the one policy over them. One module per concern:

* :mod:`~training.checkpoint.manager`: :class:`CheckpointManager`, the owner of the save/restore policy across
  both tiers (the trainer only asks it);
* :mod:`~training.checkpoint.storage`: :class:`StorageTier`, DCP checkpoints on shared storage (async saves,
  commit markers with CRC32C, verification, quarantine, retention), a facade over its parts:
  :mod:`~training.checkpoint.storage_writer` (save, commit, prune), :mod:`~training.checkpoint.storage_reader`
  (discover, verify, load, quarantine), :mod:`~training.checkpoint.storage_start` (checks before training),
  :mod:`~training.checkpoint.storage_site` (directory, ranks, group) and :mod:`~training.checkpoint.storage_choices`
  (their decisions; pure); an async save's background write runs in :mod:`~training.checkpoint.background`'s
  writer process per rank (its own side: :mod:`~training.checkpoint.write_process`) or a thread;
* :mod:`~training.checkpoint.memory`: :class:`MemoryTier`, in-memory snapshots on the node and a peer;
* :mod:`~training.checkpoint.local_shards`: a snapshot of this rank's own shards copied straight into the model
  and optimizer (no DCP optimizer initialisation);
* :mod:`~training.checkpoint.snapshot_copy`: a snapshot's copy in pieces on a few threads (GPU: reused pinned
  blocks on a side stream), each piece checksummed as it lands;
* :mod:`~training.checkpoint.copy_plan`: how a snapshot is cut into those pieces and the replica into chunks (pure);
* :mod:`~training.checkpoint.fast_crc`: CRC32C without the GIL, in pieces, combined into one;
* :mod:`~training.checkpoint.snapshot_budget`: how often the memory tier snapshots (``auto``: within a share of
  training time; pure arithmetic);
* :mod:`~training.checkpoint.restore_plan`: which snapshot a restart restores and which copy of each shard (pure);
* :mod:`~training.checkpoint.layout`: a checkpoint directory's names and discovery (torch-free);
* :mod:`~training.checkpoint.staging`: the reused host buffers async saves copy into;
* :mod:`~training.checkpoint.host_buffers`: both tiers' host buffers, handed from an in-place survivor's old tiers
  to its new ones (page-locked on GPUs: pinned once per process, not once per recovery);
* :mod:`~training.checkpoint.step_writer`: DCP's writer for a step directory rank 0 made (never made again);
* :mod:`~training.checkpoint.integrity`: CRC32C of files and the words for storage and peer failures;
* :mod:`~training.checkpoint.run_lock`: one run at a time per checkpoint.dir;
* :mod:`~training.checkpoint.run_identity`: what defines a run (the fingerprint a resume is checked against);
* :mod:`~training.checkpoint.state`: the Stateful objects a checkpoint holds (train state, RNG, model only);
* :mod:`~training.checkpoint.fence`: the commit fence (a replaced worker group never completes a checkpoint; the
  etcd side is the launch room's), :mod:`~training.checkpoint.generation` (the round a group trains in, as its
  agent noted it) and :mod:`~training.checkpoint.stale_rule` (which checkpoints a replaced group wrote; pure).

Importing the package imports no torch: the layout's names are re-exported here for the start checks and the
tools (``from training.checkpoint import MARKER, latest_complete``).
"""

from training.checkpoint.layout import (
    LINEAGE,
    LOCK,
    MARKER,
    MARKER_FIELDS,
    OURS_AT_ROOT,
    OWNED,
    PREFIX,
    PROBE,
    QUARANTINE,
    ROLLBACK,
    SCRATCH_RE,
    SUPERSEDED,
    foreign_entries,
    is_checkpoint_root,
    is_ours,
    latest_complete,
    nesting_problem,
    parse_step,
    read_marker,
    scan,
    step_dir,
    verify,
)

__all__ = [
    "LINEAGE",
    "LOCK",
    "MARKER",
    "MARKER_FIELDS",
    "OURS_AT_ROOT",
    "OWNED",
    "PREFIX",
    "PROBE",
    "QUARANTINE",
    "ROLLBACK",
    "SCRATCH_RE",
    "SUPERSEDED",
    "foreign_entries",
    "is_checkpoint_root",
    "is_ours",
    "latest_complete",
    "nesting_problem",
    "parse_step",
    "read_marker",
    "scan",
    "step_dir",
    "verify",
]
