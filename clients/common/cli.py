"""What the clients' command lines share: run the chosen subcommand with logging set up."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

EXIT_USAGE = 2


def run_command(parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> int:
    """Parse ``argv``, set up logging (``-v`` for more) and run the subcommand's ``func``."""
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
