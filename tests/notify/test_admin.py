"""The admin shows subscriptions and ntfy targets read-only, without their secrets."""

from __future__ import annotations

import pytest

from notify import services
from notify.models import NtfyTarget
from tests.accounts.helpers import code_step, password_step, totp_code, totp_device

pytestmark = pytest.mark.django_db


@pytest.fixture
def verified_admin(client, django_user_model, password):
    operator = django_user_model.objects.create_superuser(username="root", password=password)
    device = totp_device(operator)
    password_step(client, "root", password)
    assert code_step(client, totp_code(device)).status_code == 302
    return client


def test_admin_lists_without_the_capabilities(verified_admin, mobile_user, browser_keys):
    subscription, _ = services.subscription_create(user=mobile_user, endpoint="https://push.example.net/secret-xyz",
                                                   **browser_keys.subscription("")["keys"])
    target = NtfyTarget.objects.create(user=mobile_user, url="https://ntfy.example.net/topic-secret-abc",
                                       click_url="https://ai1net.example/m/")
    for url in ("/admin/notify/pushsubscription/", f"/admin/notify/pushsubscription/{subscription.pk}/change/",
                "/admin/notify/ntfytarget/", f"/admin/notify/ntfytarget/{target.pk}/change/"):
        response = verified_admin.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        assert "secret-xyz" not in page and "topic-secret-abc" not in page and browser_keys.auth not in page, url
    assert "push.example.net" in verified_admin.get("/admin/notify/pushsubscription/").content.decode()
