"""DCP's file-system writer for a step directory that rank 0 made before the save: it never makes the directory.

Rank 0 creates each step directory with its ownership file inside before any rank writes (scratch name, one rename:
:meth:`training.checkpoint.storage_writer.StorageWriter.save`), and every rank passes a collective after it. DCP's
own ``FileSystemWriter`` makes the directory again on every rank as it plans its part (``prepare_local_plan``).
After a failed save rank 0 removes its directory; a rank whose part was planned after that brought it back
without the ownership file, and the job's next save of that step refused it as a directory the job did not write
(exit 2). Seen after an in-place recovery that rolled back one step while the killed rank's save of the held step
was in flight (4 ranks, ``tests/e2e/failover/test_inplace_blocked_rank_e2e.py``, 2 of 3 runs, 2026-11-30).
"""

from __future__ import annotations

import os

from torch.distributed.checkpoint import FileSystemWriter


class StepDirWriter(FileSystemWriter):
    """``FileSystemWriter`` (its defaults, as ``checkpoint_id=path`` gives) whose plan refuses a missing directory."""

    def prepare_local_plan(self, plan):
        if not os.path.isdir(self.path):
            raise FileNotFoundError(
                f"{self.path} is gone (its save failed on another rank and was removed): not made again here"
            )
        return super().prepare_local_plan(plan)
