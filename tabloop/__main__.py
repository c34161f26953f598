"""`python -m tabloop`: the `tabloop` command."""

from __future__ import annotations

import sys

from tabloop.cli import main

if __name__ == "__main__":
    sys.exit(main())
