"""``python -m training.launch``: the launcher CLI (:mod:`training.launch.cli`; ``--help`` lists everything)."""

import sys

from training.launch.cli import main

sys.exit(main())
