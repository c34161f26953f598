"""`tabloop bench scale`: a short run of an older commit's code, as the baseline runs it.

The baseline's path is the one that differs from the measured runs: the code comes out of git
(`git archive`), migrates its own database and makes its tokens, and the bench counts what it
stored without migrating. Here the "older commit" is HEAD, so the test needs no history.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from evaluation.bench.scale import REPO_ROOT, extract_source, run_once
from tests.support.backend_server import postgres_url

pytestmark = pytest.mark.skipif(
    postgres_url() is None, reason="needs PostgreSQL (TABLOOP_TEST_POSTGRES_URL; .ci/run sets it)"
)


def _in_git_checkout() -> bool:
    probe = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="needs the project's git history")
def test_an_extracted_commit_serves_the_load_and_stores_every_event_once(tmp_path: Path) -> None:
    source = extract_source("HEAD", tmp_path)
    committed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", "HEAD:backend/cli.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert (source / "backend" / "cli.py").read_bytes() == committed

    base = postgres_url()
    assert base is not None
    run = run_once(
        base,
        instances=1,
        duration=2.0,
        tenants=2,
        concurrency=2,
        batch=10,
        failover_s=30.0,
        kill=False,
        extra=[],
        workdir=tmp_path,
        source=source,
    )
    assert run["options"] == []  # the old code is started with only the options it knew
    assert run["events_acknowledged"] > 0
    assert run["rows_stored"] == run["events_sent"]
    assert run["lost"] == 0
    assert run["stored_equals_sent"]
