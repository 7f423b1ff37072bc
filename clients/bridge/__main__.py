"""Entry point for ``python -m clients.bridge`` and for the ``ai1net-bridge.pyz`` zipapp."""

from __future__ import annotations

import sys


def main() -> None:
    from clients.bridge.cli import main as cli_main

    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
