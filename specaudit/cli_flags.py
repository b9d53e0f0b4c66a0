"""argparse pieces the command modules share (stdlib only: imported while every parser is built)."""
from __future__ import annotations

import argparse


class Given(argparse.Action):
    """Stores the value and notes that the flag was typed (`<dest>_given`): a typed flag
    overrides a configuration file's setting, the flag's default does not."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)
