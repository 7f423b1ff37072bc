"""Device web: /d/<device>/<port>/<path> reaches 127.0.0.1:<port> on the user's own bridge through its
tunnel. ``gates`` decides who may (one function for HTTP and WebSocket), ``http`` streams HTTP,
``ws`` relays WebSockets, ``streams`` holds what both share (the link to the tunnel, headers, pages).
The stream frames are specified in clients/protocol.py (``web.*``)."""
