"""``python -m capseal``: the ``capseal`` command line."""

import sys

from .cli import main

sys.exit(main())
