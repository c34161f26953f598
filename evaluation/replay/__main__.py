"""`python -m evaluation.replay`: the same as `tabloop eval replay`."""

from __future__ import annotations

import sys

from evaluation.replay.command import main

sys.exit(main(sys.argv[1:]))
