"""Entry point for ``python -m clients.bridge`` and for the ``ai1net-bridge.pyz`` zipapp.

``hook`` is run by the agent host for every hook event, so it skips the command line (argparse, the
registry of subcommands, logging) and goes straight to ``clients.bridge.hook``, which imports only the
standard library's cheapest modules. Every other command goes through ``clients.bridge.cli``.
"""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if "hook" in argv:
        from clients.bridge import hook

        if hook.parse_args(argv) is not None:
            sys.exit(hook.main(argv))
    from clients.bridge.cli import main as cli_main

    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
