#!/bin/sh
# Container entrypoint. `gatekeeper serve` is the prestart sequence itself: wait for the
# database (DATABASE_WAIT_SECONDS), apply the Alembic migrations, register the bootstrap admin
# key (GATEKEEPER_BOOTSTRAP_ADMIN_KEY), then serve with WEB_WORKERS uvicorn workers.
set -eu
exec gatekeeper serve --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" "$@"
