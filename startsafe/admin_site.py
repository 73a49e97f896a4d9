"""The admin site, opened to the operators and admins groups.

Django's admin wants ``is_staff``; our roles are groups (product.md: adding a user
to a group gives the whole role), so membership of either group lets a user in,
and the group's permissions decide what they see and change there.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ValidationError

ROLE_GROUPS = ("operators", "admins")


def may_use_admin(user) -> bool:
    if not (user and user.is_active):
        return False
    return user.is_staff or user.groups.filter(name__in=ROLE_GROUPS).exists()


class RoleAuthenticationForm(AdminAuthenticationForm):
    def confirm_login_allowed(self, user):
        if not may_use_admin(user):
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )


class StartsafeAdminSite(admin.AdminSite):
    site_header = "startsafe administration"
    site_title = "startsafe"
    index_title = "Agents, runs and the audit log"
    login_form = RoleAuthenticationForm

    def has_permission(self, request):
        return may_use_admin(request.user)

    def login(self, request, extra_context=None):
        # With STARTSAFE_LOCAL_LOGIN off its password form could only fail (no backend
        # checks passwords): the console's sign-in page offers the provider instead.
        if not settings.STARTSAFE["LOCAL_LOGIN"] and not self.has_permission(request):
            return redirect_to_login(request.GET.get(REDIRECT_FIELD_NAME) or "/admin/")
        return super().login(request, extra_context)
