"""The ``dpstream`` command (placeholder until the command-line issue lands)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpstream",
        description="Differentially private histograms and top-k under continual observation.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    build_parser().print_help(sys.stdout)
    return 0
