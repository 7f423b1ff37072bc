"""What the bridge and the probe share: the credential file, the pairing ceremony and the tunnel.

Standard library and ``websockets`` only (``qrcode`` optional), Python 3.9 compatible: this code runs
on the user's machines, from a checkout or from a single-file ``.pyz``.
"""
