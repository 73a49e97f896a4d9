"""A web process leaves its startup objects out of the garbage collector's full passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Loads the WSGI module as a gunicorn worker does, then reports the permanent
# generation's size and whether a view module was loaded before the freeze.
PROBE = """
import gc, sys
import startsafe.wsgi
print(gc.get_freeze_count(), "approvals.views" in sys.modules, "runs.api.views" in sys.modules)
"""


def test_the_wsgi_module_freezes_the_loaded_app():
    env = {
        **os.environ,
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "startsafe.settings",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    frozen, views_loaded, api_loaded = out.stdout.split()
    # Tens of thousands of objects: the app, its views and the API's schemas.
    assert int(frozen) > 20_000
    assert views_loaded == "True" and api_loaded == "True"
