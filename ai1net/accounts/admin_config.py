from django.contrib.admin.apps import AdminConfig


class Ai1netAdminConfig(AdminConfig):
    """django.contrib.admin with the two-factor admin site as the default ``admin.site``."""

    default_site = "ai1net.accounts.admin_site.OTPAdminSite"
