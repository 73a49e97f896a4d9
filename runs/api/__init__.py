"""The agent API (api.md): the journal's HTTP face. The rules it calls live in ``runs/``."""
