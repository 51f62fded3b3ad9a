"""The `tiered` command line (entry point ``tieredcore.cli.main:main``); one module per command group."""
