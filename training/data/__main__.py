"""``python -m training.data prepare SRC DST`` / ``verify DST``: see :func:`training.data.dataset.main`."""

import sys

from training.data.dataset import main

if __name__ == "__main__":
    sys.exit(main())
