"""Command lines of the project's entry points (`tiered`, the Spark jobs): a usage error is one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

USAGE_EXIT = 2  # argparse's exit code for bad usage, the project's for bad input


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming the command, plus a hint where to look, not the whole usage (a
    command line with a dozen options buries its one mistake under it)."""

    def error(self, message: str) -> NoReturn:
        hint = f"see `{self.prog} --help`"
        if "expected one argument" in message:  # `--deletion-lag -5h`: the value looks like an option
            opt = message.split()[1].rstrip(":") if message.startswith("argument ") else "--option"
            hint = f"a value starting with '-' is written {opt.split('/')[-1]}=VALUE; {hint}"
        self.exit(USAGE_EXIT, f"{self.prog}: {message} ({hint})\n")
