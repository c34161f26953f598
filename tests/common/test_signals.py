"""SIGTERM inside `sigterm_as_exit` ends the process as an exit: a training child it started (in
a process group of its own, which the signal does not reach) is stopped by its finalizer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from common.signals import sigterm_as_exit
    from training.background import TrainingChild

    work = Path(sys.argv[1])
    with sigterm_as_exit():
        child = TrainingChild.launch(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            env={}, stdout=work / "out", stderr=work / "err",
        )
        print(child.pid, flush=True)
        while True:
            time.sleep(0.05)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and SIGTERM")
def test_sigterm_stops_what_the_command_started(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 143
        child.wait(timeout=60)  # raises if the child outlives its parent
    finally:
        if child.is_running():
            child.kill()
