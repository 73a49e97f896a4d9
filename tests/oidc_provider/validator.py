from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    # Every claim below in every answer, whatever the scopes: "groups" belongs to none
    # of the standard scopes, and DOT would drop it.
    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "preferred_username": user.username,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
