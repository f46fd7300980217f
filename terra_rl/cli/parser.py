"""Command-line helpers shared by the scripts and entry points."""

from __future__ import annotations

import argparse


class OneLineErrorParser(argparse.ArgumentParser):
    """Reports bad arguments as one stderr line (no usage dump) and exits with code 2.
    Flags must be spelled in full: a prefix (`--num_env`) is an error, never silently some
    other flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")
