"""The Celery app. Tasks live in each app's ``tasks.py``; the schedule is in settings."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "startsafe.settings")

app = Celery("startsafe")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
