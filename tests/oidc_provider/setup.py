"""Run in the provider's process (django shell): the client and a user in a group.

argv-free: reads OIDC_PROVIDER_* from the environment."""

import os

from django.contrib.auth.models import Group, User
from oauth2_provider.models import Application

user = User.objects.create_user("alice", "alice@example.com", "provider-password")
user.groups.add(Group.objects.create(name="sre"), Group.objects.create(name="security"))
Application.objects.create(
    name="startsafe",
    client_id=os.environ["OIDC_PROVIDER_CLIENT_ID"],
    client_secret=os.environ["OIDC_PROVIDER_CLIENT_SECRET"],
    client_type=Application.CLIENT_CONFIDENTIAL,
    authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
    redirect_uris=os.environ["OIDC_PROVIDER_REDIRECT_URI"],
    post_logout_redirect_uris=os.environ["OIDC_PROVIDER_LOGOUT_REDIRECT_URI"],
    algorithm=Application.RS256_ALGORITHM,
    skip_authorization=True,
)
