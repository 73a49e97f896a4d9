from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from startsafe.linger import lingering_close
from startsafe.proxies import behind_trusted_proxies
from startsafe.startup import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "startsafe.settings")
# REMOTE_ADDR is the client's, also behind nginx (startsafe/proxies.py); a body the
# app did not read is read on before gunicorn closes (startsafe/linger.py).
application = lingering_close(behind_trusted_proxies(get_wsgi_application()))
# Each gunicorn worker imports this module: what the app keeps for its whole life
# is left out of the garbage collector's full passes (startsafe/startup.py).
freeze_startup_objects()
