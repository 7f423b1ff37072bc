from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.management.base import BaseCommand

from ai1net.accounts import services


class Command(BaseCommand):
    help = "On an empty database, print a one-time, expiring link that creates the first operator account."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--public-url", default="", help="Base URL the browser uses (default AI1NET_PUBLIC_URL).")
        parser.add_argument("--ttl-minutes", type=int, default=60)

    def handle(self, *args, public_url: str, ttl_minutes: int, **options) -> None:  # noqa: ANN003
        created = services.first_run_token_create(ttl=dt.timedelta(minutes=ttl_minutes))
        if created is None:
            return  # users exist: nothing to say
        _, raw = created
        base = (public_url or settings.PUBLIC_URL or "http://127.0.0.1:8000").rstrip("/")
        self.stdout.write(
            f"\nNo accounts yet. Create the first operator here (works once, expires in {ttl_minutes} minutes):\n"
            f"  {base}/setup/{raw}\n"
        )
