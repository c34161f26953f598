"""A tool run in a child process, its output kept for the error when it fails.

Converting a model (the ONNX builder, the embedder's export) needs libraries and gigabytes that a
long-running process should not keep, and prints progress that, in the language server, would
land in the LSP stream: so it runs as a child, stdin closed, its output captured.
"""

from __future__ import annotations

import os
import subprocess

_TAIL = 1500  # characters of the output kept in an error


class ChildFailed(RuntimeError):
    """The child exited with an error or ran past its time."""


def run_child(command: list[str], *, timeout_s: float, what: str) -> str:
    """Run `command` and return its output (stdout and stderr together).

    Raises `ChildFailed` naming `what` ("the ONNX builder") with the end of the output when it
    exits with an error, or when it runs past `timeout_s` (it is killed).
    """
    environment = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ChildFailed(f"{what} ran past {timeout_s:.0f} s") from exc
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        raise ChildFailed(f"{what} failed (exit status {done.returncode}): {output[-_TAIL:]}")
    return output
