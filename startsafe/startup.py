"""Once a web process has loaded the app, its long-lived objects leave the GC's sight.

Python's cyclic garbage collector now and then runs a full collection, which visits
every object the process tracks. Most of them are the app itself: modules, classes,
URL patterns, the API's schemas, compiled templates, made once and kept for the
life of the process. At the bench's scale a full collection in a console process
took ~100 ms, once every 50 to 100 requests, and those were the pages' p99 (the
queue: 90 ms p50, 240 ms p99; docs/performance.md).

``gc.freeze()`` (Python's documented tool for long-running servers) moves every
tracked object to a permanent generation that collections skip. Called after the
URL configuration is loaded, so every view module and the API are in it, a full
collection then only visits what requests made since, which measured ~25 ms.
Garbage is still collected as before: reference counting frees most objects at
once, and the collector still finds the cycles among the objects made later.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Load every view, then move all objects tracked so far to the permanent generation."""
    from django.urls import get_resolver

    # Read for what it imports: each app's urls and views, and the API.
    get_resolver().url_patterns  # noqa: B018
    gc.collect()
    gc.freeze()
