import json
import urllib.request

import pytest

from tests.e2e_support import Daphne


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_daphne_serves_healthz_against_the_test_database(tmp_path):
    server = Daphne(tmp_path)
    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
            body = json.loads(response.read())
        assert body == {"status": "ok", "database": "ok", "channel_layer": "ok"}
    finally:
        server.stop()
