"""The `tgserve` command: `serve`, `generate` and `bench` subcommands.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args) -> int`;
this file only wires them, so `tgserve --help` stays cheap (torch is imported lazily).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("server.serve", "serve a model over HTTP (OpenAI and TGI APIs)"),
    "generate": ("server.generate_command", "generate text for one prompt, streamed to the terminal"),
    "bench": ("bench.cli", "measure latency, throughput and serving performance"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tgserve", description="Text-generation inference server.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
