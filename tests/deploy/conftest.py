"""Reuse the service fixtures (PostgreSQL database per module, Redis)."""

from tests.service.conftest import _postgres_template, postgres_url, redis_url  # noqa: F401
