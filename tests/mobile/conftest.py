import pytest

from tests.mobile.factories import bridge_for, enable_mobile


@pytest.fixture
def mobile_user(user):
    return enable_mobile(user)


@pytest.fixture
def bridge(mobile_user):
    return bridge_for(mobile_user)


@pytest.fixture
def phone(client, mobile_user):
    """The user's phone: a logged-in browser session."""
    client.force_login(mobile_user)
    return client
