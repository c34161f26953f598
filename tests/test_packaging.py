"""The wheel `make dist` builds: the project's packages, and nothing that is not one."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "tabloop",
    "evaluation",
    "lsp_server",
    "backend",
    "training",
    "completion",
    "indexer",
    "telemetry",
    "common",
}


def test_wheel_holds_the_packages_and_the_command(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tabloop-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == PACKAGES
    # The benchmarks ship inside evaluation; their results and the tests stay in the checkout.
    assert "evaluation/bench/lsp.py" in names
    assert not any(name.startswith(("bench/", "tests/")) for name in names)
    assert "tabloop = tabloop.cli:main" in scripts
    # The dashboard as `make dashboard` built it (ignored by git, named as a build artefact),
    # without its web sources or npm's folder.
    assert "backend/dashboard/static/index.html" in names
    assets = [n for n in names if n.startswith("backend/dashboard/static/assets/")]
    assert {n.rsplit(".", 2)[0].rsplit("/", 1)[1] for n in assets} == {"uplot", "app"}
    assert not any(name.startswith("backend/dashboard/web/") for name in names)
