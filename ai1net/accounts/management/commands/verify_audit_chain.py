from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ai1net.accounts.selectors import audit_chain_verify


class Command(BaseCommand):
    help = "Verify the audit log's hash chain; exits non-zero naming the first bad entry."

    def handle(self, *args, **options) -> None:  # noqa: ANN003
        checked, broken = audit_chain_verify()
        if broken is not None:
            raise CommandError(f"audit chain broken at entry #{broken.entry_id}: {broken.reason} "
                               f"({checked} entries before it are intact)")
        self.stdout.write(f"audit chain ok: {checked} entries")
