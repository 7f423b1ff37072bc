"""The hook's command from a checkout, as a script: ``python -I -S <checkout>/clients/bridge/run_hook.py
--home H hook --window W --answer-style S`` (what ``hooks install`` writes there).

A script, not ``-m clients.bridge``: no ``runpy`` (and the ``importlib.util`` it loads) and no
PYTHONPATH, so the interpreter can start isolated (``-I``); it puts the checkout on the path itself.
Keep it this small: a script is compiled on every run (``clients.bridge.hook``'s bytecode is cached).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from clients.bridge.hook import exit_now, main  # noqa: E402

if __name__ == "__main__":
    exit_now(main())
