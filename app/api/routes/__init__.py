"""Routers of API v1."""
