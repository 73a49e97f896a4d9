"""The Celery app. Tasks live in each app's ``tasks.py``; the schedule is in settings."""

from __future__ import annotations

import logging
import os
import time

from celery import Celery
from celery.signals import task_failure, task_postrun, task_prerun

from startsafe.logs import kv

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "startsafe.settings")

app = Celery("startsafe")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("startsafe.tasks")
_started: dict[str, float] = {}


# One key=value line per task run, whatever the task, so logs show every task's
# outcome and duration in the same shape as the state changes.
@task_prerun.connect
def _log_task_start(task_id=None, task=None, **kwargs) -> None:
    _started[task_id] = time.monotonic()


@task_postrun.connect
def _log_task_end(task_id=None, task=None, state=None, **kwargs) -> None:
    began = _started.pop(task_id, None)
    duration = f"{time.monotonic() - began:.4f}" if began is not None else ""
    logger.info(kv("task", name=task.name, id=task_id, state=state, duration=duration))


@task_failure.connect
def _log_task_failure(task_id=None, exception=None, sender=None, **kwargs) -> None:
    logger.error(
        kv("task_failed", name=getattr(sender, "name", ""), id=task_id, error=repr(exception))
    )
