"""The `tiered` command line (entry point ``tieredcore.cli:main``); one module per command group."""

from tieredcore.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
