"""``python -m specbench.cli``: the ``specbench`` command."""

import sys

from specbench.cli import main

sys.exit(main())
