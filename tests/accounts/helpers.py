from __future__ import annotations

import time

from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice


def totp_device(user) -> TOTPDevice:
    return TOTPDevice.objects.create(user=user, name="app", confirmed=True)


def totp_code(device: TOTPDevice, offset: float = 0.0) -> str:
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + offset
    return f"{totp.token():06d}"


def password_step(client, username: str, password: str, next_url: str = ""):
    data = {"username": username, "password": password}
    if next_url:
        data["next"] = next_url
    return client.post("/accounts/login/", data)


def code_step(client, code: str, next_url: str = ""):
    data = {"code": code}
    if next_url:
        data["next"] = next_url
    return client.post("/accounts/login/code/", data)


def logged_in_user_id(client):
    return client.session.get("_auth_user_id")
