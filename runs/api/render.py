"""The agent API's JSON renderer: orjson instead of ``json.dumps``.

Every answer of the API goes through it, and the journal's answers carry whole
runs with their journals: orjson serialises them several times faster than the
standard library (it is C, and writes UTF-8 bytes directly), which ``make bench``
shows on the write path. The API's schemas give strings for times and ids, so the
output is the same JSON; anything orjson does not know falls back to ninja's
encoder.
"""

from __future__ import annotations

import orjson
from ninja.renderers import BaseRenderer
from ninja.responses import NinjaJSONEncoder

_fallback = NinjaJSONEncoder().default


class ORJSONRenderer(BaseRenderer):
    media_type = "application/json"

    def render(self, request, data, *, response_status):
        return orjson.dumps(data, default=_fallback)
