"""The HTTP API: thin FastAPI routers over :mod:`app.services` (contract.md, REST API v1)."""
