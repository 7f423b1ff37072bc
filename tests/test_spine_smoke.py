import pytest


@pytest.mark.django_db
def test_healthz_checks_database_and_channel_layer(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "channel_layer": "ok"}


def test_no_top_level_platform_package():
    import platform

    assert hasattr(platform, "python_version"), "the standard platform module must not be shadowed"
