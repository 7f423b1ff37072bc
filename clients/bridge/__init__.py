"""ai1net-bridge: the desktop side of mobile reply. ``python -m clients.bridge --help``."""

__version__ = "0.1.0"
