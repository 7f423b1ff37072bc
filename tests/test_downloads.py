import io
import zipfile

import pytest


@pytest.mark.parametrize("name", ["ai1net-bridge.pyz", "ai1net-probe.pyz"])
def test_the_clients_are_served_as_single_files(client, settings, tmp_path, name):
    settings.DOWNLOADS_DIR = tmp_path  # empty: the first request builds them
    response = client.get(f"/downloads/{name}")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    assert "__main__.py" in archive.namelist()
    assert "clients/protocol.py" in archive.namelist()


def test_unknown_downloads_are_404(client):
    assert client.get("/downloads/settings.py").status_code == 404
    assert client.get("/downloads/..%2Fmanage.py").status_code == 404
