"""The baseline project's settings: as little as Django needs to answer one view.

``DATABASE_URL`` and ``SECRET_KEY`` come from the environment ``bench/run.py``
gives the project's server; nothing of ``startsafe/settings.py`` is used.
"""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = os.environ["SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["bench.baseline"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bench.baseline.urls"
USE_TZ = True
# A persistent connection per worker (None: never closed for its age), as a
# minimal Django project on PostgreSQL would configure it; no health checks, which
# would cost a round trip at each request's first query.
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=None)}
