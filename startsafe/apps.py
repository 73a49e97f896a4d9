from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class StartsafeAdminConfig(AdminConfig):
    """Django's admin with our site, which lets the role groups in (admin_site.py)."""

    default_site = "startsafe.admin_site.StartsafeAdminSite"
