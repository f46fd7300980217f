"""Command-line helpers shared by the scripts and entry points."""

from __future__ import annotations

import argparse


class OneLineErrorParser(argparse.ArgumentParser):
    """Reports bad arguments as one stderr line (no usage dump) and exits with code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")
