"""Dockerfile and docker-compose.yml, read against what the tests run natively.

No Docker engine runs here, so the files are checked for what they reference (paths, settings,
routes, users) and the entrypoint is *run* natively with the environment docker-compose gives
the API container, against the test PostgreSQL and Redis.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml

from app.bootstrap import create_app
from app.crypto import new_key
from app.settings import Settings
from tests.service.conftest import _free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
KEY = "compose-test-key-" + "x" * 32
ENCRYPTION_KEY = new_key()


def _api_env() -> dict[str, str]:
    env = {k: str(v) for k, v in COMPOSE["services"]["api"]["environment"].items()}
    env["GATEKEEPER_BOOTSTRAP_ADMIN_KEY"] = KEY
    env["GATEKEEPER_ENCRYPTION_KEYS"] = ENCRYPTION_KEY
    return env


def _worker_env() -> dict[str, str]:
    env = {k: str(v) for k, v in COMPOSE["services"]["worker"]["environment"].items()}
    env["GATEKEEPER_ENCRYPTION_KEYS"] = ENCRYPTION_KEY
    return env


def _worker_argv() -> list[str]:
    worker = COMPOSE["services"]["worker"]
    return [*worker["entrypoint"], *worker["command"]]


def test_compose_environment_names_known_settings() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    for env in (_api_env(), _worker_env()):
        unknown = set(env) - fields
        assert not unknown, f"compose sets variables the service does not read: {unknown}"


def test_compose_environment_passes_the_production_checks() -> None:
    env = _api_env()
    settings = Settings(**{k.lower(): v for k, v in env.items()})
    assert settings.gatekeeper_env == "production"
    assert not settings.is_sqlite
    assert settings.redis_url
    assert settings.web_workers == 4
    worker = Settings(**{k.lower(): v for k, v in _worker_env().items()})
    assert worker.gatekeeper_env == "production"
    # the API and the workers must meet in the same queues, results and database
    for name in ("database_url", "redis_url", "broker_url", "broker_namespace", "result_url"):
        assert getattr(worker, name) == getattr(settings, name), name
    assert worker.broker_url is not None
    assert worker.bound_time_limit == settings.bound_time_limit


def test_compose_worker_service_runs_the_worker_command_and_scales() -> None:
    """``docker compose up --scale worker=N`` needs no fixed name or published port."""
    from app.cli import build_parser, cmd_worker

    worker = COMPOSE["services"]["worker"]
    argv = _worker_argv()
    assert argv[0] == "gatekeeper"
    args = build_parser().parse_args(argv[1:])
    assert args.func is cmd_worker
    assert args.concurrency >= 1
    assert "ports" not in worker
    assert "container_name" not in worker
    assert worker["build"] == COMPOSE["services"]["api"]["build"]  # the same image
    assert worker["depends_on"]["api"]["condition"] == "service_healthy"  # migrated first
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["healthcheck"] == {"disable": True}  # the image's check is HTTP


def test_compose_wires_healthy_dependencies_and_a_volume() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"api", "worker", "postgres", "redis"}
    depends = services["api"]["depends_on"]
    assert depends["postgres"]["condition"] == "service_healthy"
    assert depends["redis"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"]
    assert "healthcheck" in services["redis"]
    assert any(v.startswith("pgdata:") for v in services["postgres"]["volumes"])
    env = services["api"]["environment"]
    pg = services["postgres"]["environment"]
    expected = (
        f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/"
        f"{pg['POSTGRES_DB']}"
    )
    assert env["DATABASE_URL"] == expected
    assert env["REDIS_URL"].startswith("redis://redis:6379")


def test_dockerfile_copies_what_exists_runs_unprivileged_and_checks_readiness() -> None:
    for source in re.findall(r"^COPY\s+(?:--\S+\s+)*(.+?)\s+\S+$", DOCKERFILE, re.M):
        for item in source.split():
            assert (ROOT / item).exists(), f"Dockerfile copies missing {item}"
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE, re.M)
    assert users, "the image must not run as root"
    assert users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["gatekeeper-entrypoint"]' in DOCKERFILE
    assert "docker/entrypoint.sh /usr/local/bin/gatekeeper-entrypoint" in DOCKERFILE
    assert os.access(ENTRYPOINT, os.X_OK)
    paths = set(create_app(Settings()).openapi()["paths"])
    for probe in re.findall(r"/(readyz|healthz)", DOCKERFILE):
        assert f"/{probe}" in paths
    exposed = re.findall(r"^EXPOSE\s+(\d+)", DOCKERFILE, re.M)
    assert exposed == [re.search(r"PORT=(\d+)", DOCKERFILE).group(1)]  # type: ignore[union-attr]
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("app", "migrations", "pyproject.toml", "alembic.ini", "docker"):
        assert needed not in ignored


def test_dependencies_are_installed_in_a_layer_before_the_source() -> None:
    """A code change must not reinstall numpy and scipy: the dependency install comes first."""
    lines = [line.strip() for line in DOCKERFILE.splitlines()]
    install = next(i for i, line in enumerate(lines) if "pip install -r requirements.txt" in line)
    copy_app = next(i for i, line in enumerate(lines) if line.startswith("COPY app"))
    assert install < copy_app
    before = "\n".join(lines[:install])
    assert "COPY pyproject.toml docker/requirements.py ./" in before
    assert "pip install --no-deps -e ." in "\n".join(lines[copy_app:])
    # the script the image runs prints exactly the project's runtime dependencies
    printed = subprocess.run(  # noqa: S603 - our own script
        [sys.executable, str(ROOT / "docker" / "requirements.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    with (ROOT / "pyproject.toml").open("rb") as handle:
        expected = tomllib.load(handle)["project"]["dependencies"]
    assert [line for line in printed if line] == expected


@pytest.mark.slow
def test_the_entrypoint_prestarts_and_serves_with_the_compose_environment(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Run docker/entrypoint.sh as the container would: wait, migrate, bootstrap, serve."""
    # a fresh, *unmigrated* database: the entrypoint must migrate it itself
    import psycopg

    admin = postgres_url.rsplit("/", 1)[0] + "/test"
    name = f"gk_entry_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    port = _free_port()
    namespace = f"deploy{os.getpid()}"
    native = {  # the compose hosts, as this machine reaches them
        "DATABASE_URL": postgres_url.rsplit("/", 1)[0] + "/" + name,
        "REDIS_URL": redis_url,
        "BROKER_URL": redis_url,
        "BROKER_NAMESPACE": namespace,
    }
    env = {
        **os.environ,
        **_api_env(),
        **native,
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "WEB_WORKERS": "2",
        "BOUND_PROCESSES": "1",
        "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    log = (tmp_path / "entry.log").open("w")
    proc = subprocess.Popen(  # noqa: S603 - our own entrypoint
        ["/bin/sh", str(ENTRYPOINT)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    worker_env = {**os.environ, **_worker_env(), **native, "PATH": env["PATH"]}
    worker_env.pop("C_FORCE_ROOT", None)  # JSON tasks: a worker runs as root as it is
    worker_log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(  # noqa: S603 - the compose worker command, natively
        _worker_argv(),
        cwd=ROOT,
        env=worker_env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # one client for every poll (an ``httpx.get`` builds one and its SSL context each time)
    poll = httpx.Client(timeout=1)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = poll.get(url + "/readyz")
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert ready is not None, (tmp_path / "entry.log").read_text()[-3000:]
        assert ready.json()["status"] == "ok", ready.text
        while time.monotonic() < deadline and ready.json().get("workers") != 2:
            time.sleep(0.3)
            ready = poll.get(url + "/readyz")
        # one worker container: a bounds node and a surveys node
        assert ready.json() == {
            "status": "ok",
            "database": "ok",
            "redis": "ok",
            "broker": "ok",
            "workers": 2,
        }, (tmp_path / "worker.log").read_text()[-3000:]
        keys = httpx.post(
            url + "/v1/keys",
            json={"role": "viewer"},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=5,
        )
        assert keys.status_code == 201, keys.text
    finally:
        poll.close()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        worker_log.close()
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        import redis

        client = redis.Redis.from_url(redis_url)  # the worker's keys on the shared Redis
        for pattern in (f"gatekeeper:celery:{namespace}:*", f"_kombu.binding*.{namespace}.*"):
            for key in client.scan_iter(match=pattern):
                client.delete(key)
        client.close()


def test_make_run_installs_only_what_serving_needs() -> None:
    """``make run`` installed the dev extra (schemathesis, mypy, hypothesis, ruff) just to serve."""
    planned = subprocess.run(  # noqa: S603 - make, fixed argv
        ["make", "-n", "-B", "-C", str(ROOT), ".venv/.installed-run"],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installs = [line for line in planned.splitlines() if "pip install" in line]
    assert any(line.rstrip().endswith("-e .") for line in installs), planned
    assert not any("[dev]" in line for line in installs), planned
    run_rule = subprocess.run(  # noqa: S603 - make, fixed argv
        ["make", "-n", "-p", "-C", str(ROOT), "run"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert re.search(r"^run: \.venv/\.installed-run\s*$", run_rule, re.M), "run needs the run stamp"
    with (ROOT / "pyproject.toml").open("rb") as handle:
        pyproject = tomllib.load(handle)
    # an SPDX string, not the deprecated table (setuptools printed a banner at every install)
    assert pyproject["project"]["license"] == "Apache-2.0"
