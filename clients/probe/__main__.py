"""Entry point for ``python -m clients.probe`` and for the ``ai1net-probe.pyz`` zipapp."""

from __future__ import annotations

import sys


def main() -> None:
    from clients.probe.cli import main as cli_main

    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
