# ldp-gatekeeper image: slim, non-root. The API (prestart = wait for the database -> migrate ->
# serve) and, with `gatekeeper worker` as entrypoint, the distributed workers (docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GATEKEEPER_ENV=production \
    HOST=0.0.0.0 \
    PORT=8000 \
    WEB_WORKERS=4

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin gatekeeper
WORKDIR /srv/gatekeeper

# Dependencies first, in a layer that only a change of pyproject.toml rebuilds; then the code,
# installed without dependencies. The editable install keeps migrations/ next to the package,
# where `gatekeeper serve` looks for them.
COPY pyproject.toml docker/requirements.py ./
RUN python requirements.py > requirements.txt && pip install -r requirements.txt
COPY README.md ./
COPY app ./app
RUN pip install --no-deps -e .
COPY migrations ./migrations
COPY alembic.ini ./
COPY docker/entrypoint.sh /usr/local/bin/gatekeeper-entrypoint

USER gatekeeper
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request,os;urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PORT','8000'), timeout=2)"
ENTRYPOINT ["gatekeeper-entrypoint"]
