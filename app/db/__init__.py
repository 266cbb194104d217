"""Persistence: SQLAlchemy 2 models, engines and sessions, and migrations.

:mod:`app.db.models`, :mod:`app.db.session`, :mod:`app.db.migrate` (Alembic scripts in
``migrations/``).
"""
