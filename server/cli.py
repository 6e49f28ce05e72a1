"""The `tgserve` command: `serve`, `generate` and `bench` subcommands.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args) -> int`;
this file only wires them, so `tgserve --help` stays cheap (torch is imported lazily).

`bench` is registered here by name and help text only: its module, `bench.cli` (the top-level
bench/ package, which may import server, engine and models), is imported only when the command
line asks for `bench`, so server/ never imports bench/ otherwise (DESIGN.md: data flows one way).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from server import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("server.serve", "serve a model over HTTP (OpenAI and TGI APIs)"),
    "generate": (
        "server.generate_command",
        "generate text for one prompt, streamed to the terminal",
    ),
    "bench": ("bench.cli", "measure latency, throughput and serving performance"),
}
# Subcommands whose module is imported only when that subcommand is the one asked for.
LAZY_SUBCOMMANDS = frozenset({"bench"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; a lazy subcommand gets its arguments only when it is `command`."""
    parser = argparse.ArgumentParser(
        prog="tgserve", description="Text-generation inference server."
    )
    parser.add_argument("--version", action="version", version=f"tgserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name in LAZY_SUBCOMMANDS and name != command:
            continue  # argv[0] names the subcommand; this one is not it, so it is never parsed
        importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as exc:
        print(f"tgserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
