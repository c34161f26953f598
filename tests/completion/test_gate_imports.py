"""Serving the gate needs numpy, not torch: the editor with an HTTP runner never loads it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import lsp_server.features

SERVING_MODULES = (
    "completion.gate",
    "completion.engine",
    "completion.policy_client",
    "lsp_server.server",
)
# Every feature module, found rather than listed, so a new one is checked too.
FEATURE_MODULES = tuple(
    module.name
    for module in pkgutil.iter_modules(lsp_server.features.__path__, "lsp_server.features.")
)


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param(SERVING_MODULES, id="gate-engine-client-server"),
        pytest.param(FEATURE_MODULES, id="lsp-features"),
    ],
)
def test_serving_modules_import_without_torch(modules: tuple[str, ...]) -> None:
    # A fresh interpreter: this test process has long imported torch through other tests.
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
        "print(json.dumps(sorted(loaded)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []
