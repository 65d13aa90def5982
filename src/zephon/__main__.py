"""``python -m zephon``: the ``zephon`` command (``zephon --help``)."""

import sys

from zephon.cli import main

sys.exit(main())
