"""The real bundled model completes a real function (slow: loads Qwen2.5-Coder-0.5B)."""

from __future__ import annotations

import ast
import os
import sysconfig
from pathlib import Path

import pytest

from completion import bundled
from completion.fim import template_for
from completion.postprocess import clean, stop_rule
from completion.runners.torch_runner import TorchRunner
from completion.types import CancelToken, CompletionRequest

# Kept between runs: assembling and dequantising the model once costs minutes. A cache that
# already holds it can be named with TABLOOP_TEST_MODEL_CACHE.
CACHE_DIR = Path(
    os.environ.get("TABLOOP_TEST_MODEL_CACHE")
    or Path(__file__).resolve().parents[2] / ".cache" / "bundled"
)

PREFIX_CHARS, SUFFIX_CHARS = 1200, 400


@pytest.fixture(scope="module")
def bundled_runner() -> TorchRunner:
    try:
        bundled.part_paths()
    except bundled.BundledModelMissing:
        pytest.skip("tabloop[models] is not installed")
    return TorchRunner("bundled", CACHE_DIR)


def body_removed(source: str, function: str) -> tuple[str, str]:
    """(prefix, suffix) of `source` with `function`'s code cut out, cursor on its first line."""
    node = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == function
    )
    lines = source.splitlines(keepends=True)
    body = node.body
    if ast.get_docstring(node) is not None and len(body) > 1:
        body = body[1:]  # the docstring stays: the model completes the code it describes
    first, last = body[0].lineno - 1, body[-1].end_lineno or node.lineno
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    prefix = "".join(lines[:first]) + indent
    suffix = "\n" + "".join(lines[last:])
    return prefix, suffix


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "function"),
    [
        pytest.param("heapq.py", "heappush", id="heapq-heappush"),
        pytest.param("bisect.py", "insort_right", id="bisect-insort_right"),
    ],
)
def test_bundled_model_completes_a_real_function(
    bundled_runner: TorchRunner, module: str, function: str
) -> None:
    source = (Path(sysconfig.get_paths()["stdlib"]) / module).read_text(encoding="utf-8")
    prefix, suffix = body_removed(source, function)
    runner = bundled_runner
    request = CompletionRequest(prefix=prefix, suffix=suffix, language="python", path=module)
    # The prompt holds a window around the cursor, as the engine's token budget would.
    window_prefix, window_suffix = prefix[-PREFIX_CHARS:], suffix[:SUFFIX_CHARS]
    generation = runner.generate(
        template_for(runner.family).build(window_prefix, window_suffix, path=module),
        max_new_tokens=64,
        stop=stop_rule(request),
        cancel=CancelToken(),
    )
    suggestion = clean(generation.text, request, min_chars=2)
    assert suggestion, f"empty suggestion from {generation!r}"
    try:
        ast.parse(prefix + suggestion + suffix)
    except SyntaxError as exc:
        pytest.fail(f"{suggestion!r} ({generation.stop_reason}) does not fit: {exc}")
    assert generation.token_logprobs and max(generation.token_logprobs) <= 0
