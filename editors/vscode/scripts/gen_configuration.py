"""Writes (or checks) the `contributes.configuration` of the VS Code extension's package.json.

The server's settings model, `lsp_server.config.Settings`, is the one source: every leaf setting
becomes a `tabloop.<dotted camelCase key>` property with its type, default, bounds, choices and
description. Two properties configure the extension itself (`tabloop.server.path` and
`tabloop.trace.server`), and `telemetry.clientEnabled` is left out: the extension sets it from
VS Code's own telemetry switch, and so are `telemetry.backendUrl` and `telemetry.token`, still
read but moved to `backend.url` and `backend.token`.

    python editors/vscode/scripts/gen_configuration.py          # rewrite package.json
    python editors/vscode/scripts/gen_configuration.py --check  # exit 1 if it drifted
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXTENSION_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = EXTENSION_DIR.parents[1]
PACKAGE_JSON = EXTENSION_DIR / "package.json"
PREFIX = "tabloop"

# Set by the editor, never by the user.
EDITOR_CONTROLLED = {"telemetry.clientEnabled"}
# Still read, and moved to their new place (`common.endpoint.MOVED_KEYS`): not offered.
MOVED = {"telemetry.backendUrl", "telemetry.token"}
NOT_CONTRIBUTED = EDITOR_CONTROLLED | MOVED

# JSON-schema keywords carried over to a VS Code configuration property as they are.
CARRIED = (
    "type",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "items",
    "anyOf",
)

CLIENT_PROPERTIES: dict[str, dict[str, Any]] = {
    f"{PREFIX}.server.path": {
        "type": "string",
        "default": "",
        "scope": "machine-overridable",
        "markdownDescription": "The language server to start: a `tabloop` executable (run as "
        "`tabloop serve --stdio`) or a Python interpreter (run as `python -m lsp_server --stdio`). "
        "Empty uses the interpreter selected in the Python extension when tabloop is installed "
        "there, else `tabloop` on `PATH`.",
    },
    f"{PREFIX}.trace.server": {
        "type": "string",
        "enum": ["off", "messages", "verbose"],
        "default": "off",
        "markdownDescription": "Log the LSP messages between VS Code and the server to the "
        "`tabloop` output channel.",
    },
}


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1]
    resolved: dict[str, Any] = schema["$defs"][name]
    return resolved


def _leaf_property(node: dict[str, Any], default: Any) -> dict[str, Any]:
    prop = {key: node[key] for key in CARRIED if key in node}
    prop["default"] = default
    if "description" in node:
        # Descriptions use `code` spans, which only markdownDescription renders.
        prop["markdownDescription"] = node["description"]
    return prop


def server_properties() -> dict[str, dict[str, Any]]:
    """`tabloop.*` properties for every user-settable leaf of the server's settings model."""
    sys.path.insert(0, str(REPO_ROOT))
    from lsp_server.config import Settings

    schema = Settings.model_json_schema(by_alias=True)
    # Defaults from an instance: the schema has none for fields with a default factory.
    defaults = Settings().model_dump(mode="json", by_alias=True)
    properties: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], node_defaults: dict[str, Any], prefix: str) -> None:
        for name, child in node["properties"].items():
            child = _resolve(schema, child)
            key = f"{prefix}{name}"
            if child.get("type") == "object" and "properties" in child:
                walk(child, node_defaults[name], f"{key}.")
            elif key not in NOT_CONTRIBUTED:
                properties[f"{PREFIX}.{key}"] = _leaf_property(child, node_defaults[name])

    walk(schema, defaults, "")
    return properties


def configuration() -> dict[str, Any]:
    """The whole `contributes.configuration` object."""
    properties = server_properties()
    properties.update(CLIENT_PROPERTIES)
    for order, prop in enumerate(properties.values()):
        prop["order"] = order
    return {"title": "tabloop", "properties": properties}


def render(package: dict[str, Any]) -> str:
    return json.dumps(package, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if package.json drifted")
    args = parser.parse_args(argv)
    text = PACKAGE_JSON.read_text(encoding="utf-8")
    package = json.loads(text)
    package.setdefault("contributes", {})["configuration"] = configuration()
    expected = render(package)
    if args.check:
        if expected != text:
            print(
                f"{PACKAGE_JSON} is out of date with lsp_server.config.Settings; run "
                "python editors/vscode/scripts/gen_configuration.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if expected != text:
        PACKAGE_JSON.write_text(expected, encoding="utf-8")
        print(f"wrote {PACKAGE_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
