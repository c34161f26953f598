"""`tabloop bench syntax`: the check from the document's last tree says what a full parse says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import syntax


def test_bench_types_lines_again_and_compares_both_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    functions = [
        f"def function_{n}(values, limit={n}):\n"
        f"    total = sum(value * {n} for value in values if value < limit)\n"
        f"    return {{'total': total, 'count': len(values)}}\n\n"
        for n in range(200)
    ]
    (tmp_path / "module.py").write_text("".join(functions), encoding="utf-8")
    assert syntax.main(["--corpus", str(tmp_path), "--files", "1", "--lines", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["files"] == 1
    assert result["keystrokes"] > 20
    assert result["identical_verdicts"] == 1.0
    assert set(result["check_ms"]) == {"from_nothing", "from_last_tree"}
    assert sum(result["outcomes"].values()) == result["keystrokes"]
