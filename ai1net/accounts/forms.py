from __future__ import annotations

from django import forms
from django.contrib.auth import password_validation

from ai1net.accounts.models import User


class LoginForm(forms.Form):
    username = forms.CharField(max_length=150, widget=forms.TextInput(attrs={"autocomplete": "username",
                                                                            "autocapitalize": "none"}))
    password = forms.CharField(strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))


class OtpForm(forms.Form):
    code = forms.CharField(
        max_length=32, label="Code",
        help_text="The 6-digit code from your authenticator app, or one of your backup codes.",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "text", "autofocus": True}),
    )


class FirstOperatorForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    password1 = forms.CharField(label="Password", strip=False, widget=forms.PasswordInput)
    password2 = forms.CharField(label="Password again", strip=False, widget=forms.PasswordInput)

    def clean_username(self) -> str:
        username = self.cleaned_data["username"]
        User.username_validator(username)
        return username

    def clean(self) -> dict:
        data = super().clean()
        if data.get("password1") and data.get("password1") != data.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        elif data.get("password1"):
            candidate = User(username=data.get("username", ""), email=data.get("email", ""))
            try:
                password_validation.validate_password(data["password1"], candidate)
            except forms.ValidationError as exc:
                self.add_error("password1", exc)
        return data


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, initial="agent")
