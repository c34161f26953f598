"""`python -m lsp_server`: the language server, as `tabloop serve`."""

from __future__ import annotations

import argparse
import sys

from lsp_server.main import add_serve_arguments, serve


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m lsp_server", description="tabloop LSP server")
    add_serve_arguments(parser)
    return serve(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
