"""`tabloop complete FILE:LINE:COL`: one completion through the same engine the server uses."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from common.languages import request_language
from completion.types import CompletionRequest
from lsp_server import config


def parse_location(location: str) -> tuple[Path, int, int]:
    """`FILE:LINE:COL` (1-based) to (path, 0-based line, 0-based column)."""
    parts = location.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"expected FILE:LINE:COL with 1-based numbers, got {location!r}")
    line, col = int(parts[1]), int(parts[2])
    if line < 1 or col < 1:
        raise ValueError("LINE and COL start at 1")
    return Path(parts[0]), line - 1, col - 1


def request_at(path: Path, line: int, col: int) -> CompletionRequest:
    """The request for a cursor in a file on disk (the column may be past the line's end)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    if line > len(lines):
        raise ValueError(f"{path} has {len(lines)} lines; line {line + 1} does not exist")
    offset = sum(len(x) for x in lines[:line])
    current = lines[line] if line < len(lines) else ""
    offset += min(col, len(current.rstrip("\r\n")))
    return CompletionRequest(
        prefix=text[:offset],
        suffix=text[offset:],
        language=request_language(None, str(path)),
        path=str(path.resolve()),
        uri=path.resolve().as_uri(),
        trigger="invoked",
        line=line,
        character=col,
    )


def complete_at(location: str, *, as_json: bool = False, workspace: str | None = None) -> int:
    try:
        path, line, col = parse_location(location)
        request = request_at(path, line, col)
    except (OSError, ValueError) as exc:
        print(f"tabloop complete: {exc}", file=sys.stderr)
        return 2
    resolved = config.resolve(Path(workspace) if workspace else path.resolve().parent)
    for problem in resolved.problems:
        print(f"configuration: {problem}", file=sys.stderr)
    settings = resolved.settings
    from completion.engine import Engine
    from completion.runners import load_runner

    started = time.perf_counter()
    try:
        engine = Engine(
            settings.completion, load_runner(settings.completion, settings.cache_path())
        )
    except Exception as exc:
        print(f"tabloop complete: could not load the model: {exc}", file=sys.stderr)
        return 1
    load_s = time.perf_counter() - started
    decision = engine.complete(request)
    if as_json:
        generation = decision.generation
        print(
            json.dumps(
                {
                    "decision_id": decision.decision_id,
                    "action": decision.action,
                    "suggestion": decision.text,
                    "reason": decision.reason,
                    "propensity": decision.propensity,
                    "policy_version": decision.policy_version,
                    "model_id": decision.model_id,
                    "load_s": round(load_s, 3),
                    "timings_ms": asdict(decision.timings),
                    "prompt_tokens": generation.prompt_tokens if generation else 0,
                    "new_tokens": generation.new_tokens if generation else 0,
                    "features": decision.features,
                },
                indent=2,
            )
        )
    else:
        print(f"{path}:{line + 1}:{col + 1}  {request.line_prefix.strip()!r}")
        print(
            f"-> {decision.action} (p={decision.propensity:.2f}) "
            f"in {decision.timings.total_ms:.0f} ms"
        )
        print(decision.text)
    engine.close()
    return 0
