from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from startsafe.proxies import behind_trusted_proxies
from startsafe.startup import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "startsafe.settings")
# REMOTE_ADDR is the client's, also behind nginx (startsafe/proxies.py).
application = behind_trusted_proxies(get_wsgi_application())
# Each gunicorn worker imports this module: what the app keeps for its whole life
# is left out of the garbage collector's full passes (startsafe/startup.py).
freeze_startup_objects()
