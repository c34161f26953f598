"""The committed test models are what their builders made, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import fixtures


@pytest.mark.parametrize(
    "directory",
    [
        pytest.param(fixtures.TINY_MODEL, id="tiny-model"),
        pytest.param(fixtures.TINY_EMBEDDER, id="tiny-embedder"),
    ],
)
def test_committed_fixture_matches_its_checksums(directory: Path) -> None:
    how = f"rebuild with `{fixtures.REBUILD}` and commit tests/fixtures/"
    assert (directory / fixtures.CHECKSUMS).is_file(), f"{directory} has no checksums; {how}"
    recorded = fixtures.recorded_checksums(directory)
    actual = fixtures.file_checksums(directory)
    assert recorded, f"{directory}/{fixtures.CHECKSUMS} lists no files; {how}"
    assert actual == recorded, f"{directory} differs from its recorded checksums; {how}"


def test_checksums_notice_a_changed_byte(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\x00\x01")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text("{}")
    fixtures.write_checksums(tmp_path)
    assert set(fixtures.recorded_checksums(tmp_path)) == {"weights.bin", "sub/config.json"}
    assert fixtures.recorded_checksums(tmp_path) == fixtures.file_checksums(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\x00\x02")
    assert fixtures.recorded_checksums(tmp_path) != fixtures.file_checksums(tmp_path)
