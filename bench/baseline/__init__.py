"""make bench's baseline: a separate, minimal Django project to measure the API against.

One settings module (``settings.py``), one model over the project's effect table
(``models.py``, unmanaged: this project owns no table), one view that reads one row
by primary key and answers JSON (``urls.py``), and the WSGI entry (``wsgi.py``).
No middleware, no authentication, a persistent database connection
(``CONN_MAX_AGE``), Django's own PostgreSQL backend with its defaults.

``bench/run.py`` serves it with the same gunicorn flags as the project's server,
on the same PostgreSQL database, so that a path's ratio to it is what startsafe
costs over the cheapest useful Django view on this machine: the project's
middleware, settings and database backend are on its side of the ratio.
"""
