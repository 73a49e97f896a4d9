from __future__ import annotations

app_name = "console"

urlpatterns: list = []
