from __future__ import annotations

import pytest
from django.test import Client

from tests.probes_platform.conftest import make_probe

pytestmark = pytest.mark.django_db


def test_studio_needs_a_login():
    response = Client().get("/studio/")
    assert response.status_code == 302 and "/login" in response["Location"]


def test_studio_lists_my_probes_only_and_sets_the_csrf_cookie(api, user, other_user):
    make_probe(user, "laptop")
    make_probe(other_user, "their-box")
    response = api.get("/studio/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "laptop" in page and "their-box" not in page
    assert 'data-testid="probe-picker"' in page and "js/studio.js" in page
    assert "csrftoken" in response.cookies
