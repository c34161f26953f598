"""Errors a model runner raises when it cannot produce a continuation."""

from __future__ import annotations


class RunnerError(RuntimeError):
    """The runner failed; the message says what to check."""


class RunnerUnavailable(RunnerError):
    """The model server could not be reached."""


class RunnerTimeout(RunnerError):
    """The call took longer than its time limit."""
