"""The trigger: a question stored for a user schedules a notice, after commit, off the hot path.

A ``post_save`` receiver rather than a call in ``mobile.services.question_create``: the question path
stays untouched, and all it costs there is registering one on-commit callback (no query: the device,
and so its owner id, is already on the instance). The callback only drops the id into the dispatcher.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from mobile.models import Question
from notify.dispatch import dispatcher


@receiver(post_save, sender=Question, dispatch_uid="notify.question_created")
def on_question_created(sender: Any, instance: Question, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if not created or raw or instance.state != Question.State.PENDING:
        return
    if Question.device.is_cached(instance):
        owner_id = instance.device.owner_id
        transaction.on_commit(lambda: dispatcher.waiting(owner_id))
    else:  # the owner is looked up by the dispatcher's pool, not here
        device_id = instance.device_id
        transaction.on_commit(lambda: dispatcher.waiting_for_device(device_id))
