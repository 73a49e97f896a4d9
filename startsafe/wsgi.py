from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from startsafe.startup import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "startsafe.settings")
application = get_wsgi_application()
# Each gunicorn worker imports this module: what the app keeps for its whole life
# is left out of the garbage collector's full passes (startsafe/startup.py).
freeze_startup_objects()
