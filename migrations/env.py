"""Alembic environment: migrates the database named by the ``sqlalchemy.url`` option, or by
``DATABASE_URL`` (through :mod:`app.settings`) when the option is not set."""

from __future__ import annotations

from alembic import context

from app.db.models import Base
from app.db.session import make_engine
from app.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade head --sql``)."""
    context.configure(
        url=url,
        target_metadata=Base.metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through a live connection."""
    engine = make_engine(url)
    with engine.connect() as connection:
        if url.startswith("sqlite"):
            # batch operations rebuild a table (copy, drop, rename): with foreign keys enforced
            # SQLite refuses to drop a table other rows reference. The pragma only takes effect
            # outside a transaction, so it is set before the migration's transaction begins.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=url.startswith("sqlite"),
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
