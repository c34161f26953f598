"""Writes (or checks) the editors' copies of tabloop's LSP names, from `lsp_server/protocol.py`.

Every upper-case constant of the protocol module (method, command and section names, progress
titles, search limits) becomes a constant of `editors/vscode/src/protocol.ts` and a field of
`editors/neovim/lua/tabloop/protocol.lua`, so neither editor spells a name by hand.

    python editors/vscode/scripts/gen_protocol.py          # rewrite both files
    python editors/vscode/scripts/gen_protocol.py --check  # exit 1 if one drifted
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXTENSION_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = EXTENSION_DIR.parents[1]
TYPESCRIPT = EXTENSION_DIR / "src" / "protocol.ts"
LUA = REPO_ROOT / "editors" / "neovim" / "lua" / "tabloop" / "protocol.lua"
HEADER = (
    "Generated from lsp_server/protocol.py by editors/vscode/scripts/gen_protocol.py; do not edit."
)


def constants() -> dict[str, str | int]:
    """The protocol module's upper-case string and integer constants, in source order."""
    sys.path.insert(0, str(REPO_ROOT))
    from lsp_server import protocol

    return {
        name: value
        for name, value in vars(protocol).items()
        if name.isupper() and isinstance(value, str | int) and not isinstance(value, bool)
    }


def _literal(value: str | int, quote: str) -> str:
    if isinstance(value, int):
        return str(value)
    # JSON escaping is valid in both languages for the plain names used here.
    return quote + json.dumps(value)[1:-1] + quote


def typescript(names: dict[str, str | int]) -> str:
    lines = [f"/* {HEADER} */", ""]
    lines += [f"export const {name} = {_literal(value, chr(39))};" for name, value in names.items()]
    return "\n".join(lines) + "\n"


def lua(names: dict[str, str | int]) -> str:
    lines = [f"-- {HEADER}", "return {"]
    lines += [f"  {name} = {_literal(value, chr(39))}," for name, value in names.items()]
    return "\n".join([*lines, "}"]) + "\n"


def outputs() -> dict[Path, str]:
    names = constants()
    return {TYPESCRIPT: typescript(names), LUA: lua(names)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file drifted")
    args = parser.parse_args(argv)
    drifted = [
        path
        for path, expected in outputs().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != expected
    ]
    if args.check:
        for path in drifted:
            print(
                f"{path} is out of date with lsp_server/protocol.py; run "
                "python editors/vscode/scripts/gen_protocol.py",
                file=sys.stderr,
            )
        return 1 if drifted else 0
    for path, expected in outputs().items():
        if path in drifted:
            path.write_text(expected, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
