"""``python -m sglang_patcher`` is the ``sglpatch`` command."""

import sys

from .entry import main

sys.exit(main())
