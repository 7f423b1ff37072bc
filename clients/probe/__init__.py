"""ai1net-probe: remote hands on a machine its owner chose, confined to an allow-list of directories.

``python -m clients.probe run URL --allow DIR`` (or the ``ai1net-probe.pyz`` the platform serves)
pairs for one run, dials out to the platform and serves ``probe.<op>`` requests; see ``ops``.
"""
