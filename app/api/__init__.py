"""The HTTP API: thin FastAPI routers over :mod:`app.services` (DESIGN.md, REST API v1)."""
