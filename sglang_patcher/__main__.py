"""``python -m sglang_patcher`` is the ``sglpatch`` command."""

import sys

from .cli import main

sys.exit(main())
