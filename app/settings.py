"""Typed settings from the environment (pydantic-settings), shared by the service and the CLI.

Every setting reads the environment variable of the same name, upper-case (``DATABASE_URL``,
``REDIS_URL``, ``GATEKEEPER_ENV``...). The embedded default — a SQLite file under ``./data``,
in-process locks, no Redis — needs no configuration. With ``GATEKEEPER_ENV=production`` the
settings refuse what is only safe on a laptop: SQLite, a missing or short bootstrap key, a
missing Redis with several uvicorn workers.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.crypto import ValueCipher, cipher_from_settings

DEFAULT_DATABASE_URL = "sqlite:///./data/gatekeeper.db"

#: ``BOUND_TIME_LIMIT``'s default: the engine's own search time limit (``BnBSettings.time_limit``;
#: settings sit below the engine, so tests/worker/test_layers.py checks that the two agree).
DEFAULT_BOUND_TIME_LIMIT = 10.0


class Environment(StrEnum):
    """Where the service runs."""

    DEVELOPMENT = "development"
    PRODUCTION = "production"


class Settings(BaseSettings):
    """All configuration of ldp-gatekeeper."""

    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    gatekeeper_env: Environment = Environment.DEVELOPMENT
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    #: Use Redis for per-object locks across replicas (correctness never depends on it).
    redis_locks: bool = True
    gatekeeper_bootstrap_admin_key: str | None = Field(default=None, repr=False)
    #: Comma-separated Fernet keys for private values at rest; the first one encrypts.
    gatekeeper_encryption_keys: str | None = Field(default=None, repr=False)
    #: Key file used when no keys are given (created 0600 on first use, except in production).
    gatekeeper_encryption_key_file: str = "./data/encryption.key"

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    web_workers: int = Field(default=1, ge=1, le=64)
    #: Seconds a web worker may leave uvicorn's liveness ping unanswered before it is restarted
    #: (uvicorn's own default of 5 s restarted workers still importing on a busy machine).
    worker_healthcheck_seconds: int = Field(default=30, ge=1, le=3600)
    bound_processes: int = Field(default=1, ge=0, le=64)
    bound_time_limit: float = Field(default=DEFAULT_BOUND_TIME_LIMIT, gt=0, le=600)
    lock_timeout: float = Field(default=30.0, gt=0, le=3600)
    lock_wait: float = Field(default=30.0, gt=0, le=3600)
    submit_attempts: int = Field(default=50, ge=1, le=1000)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    #: Requests a second per API key (0: no limit) and the burst allowed (0: twice the rate).
    rate_limit_per_second: float = Field(default=0.0, ge=0, le=1e6)
    rate_limit_burst: int = Field(default=0, ge=0, le=10**7)
    database_wait_seconds: float = Field(default=30.0, ge=0)
    log_level: str = "INFO"
    #: PostgreSQL connections per web worker (pool) and extra ones under bursts.
    db_pool_size: int = Field(default=5, ge=1, le=100)
    db_max_overflow: int = Field(default=5, ge=0, le=100)
    #: Seconds a worker trusts an authenticated API key without asking the database; a key
    #: revoked elsewhere keeps working that long in other worker processes when no Redis
    #: announcement reaches them (app.services.auth.RevocationListener; 0: no cache).
    auth_cache_seconds: float = Field(default=5.0, ge=0, le=300)
    #: Population surveys: the largest cohort, members decided per transaction, and how long a
    #: process's claim on a running survey lasts without renewal (then another takes over).
    survey_max_members: int = Field(default=5_000_000, ge=1, le=100_000_000)
    survey_chunk_size: int = Field(default=5000, ge=1, le=100_000)
    survey_lease_seconds: float = Field(default=30.0, gt=0, le=3600)
    #: How often a web process deletes the likelihood states no object names (0: only at
    #: ``gatekeeper serve``'s start, a survey's end and ``gatekeeper states collect``).
    states_collect_seconds: float = Field(default=3600.0, ge=0, le=7 * 24 * 3600)
    #: Threads deciding a survey's chunks at once in one process (one samples while another's
    #: chunk is in the database).
    survey_threads: int = Field(default=2, ge=1, le=32)
    #: Child processes deciding a survey's chunks in a web process without a broker, started
    #: with its first survey (0: ``SURVEY_THREADS`` threads of the web process decide them).
    #: 0 by default: each child decides the survey's groups again for itself (+27% CPU) and
    #: holds its own run cache (+80% memory with 2), and on the shared 2-core machine two were
    #: slower than the threads (docs/benchmarks.md, "h/procs"); worth it with idle cores.
    survey_processes: int = Field(default=0, ge=0, le=32)
    #: Distributed worker module (Celery): the broker (``redis://`` or ``amqp://``; unset: all
    #: work in this process), how long results live in Redis, and the name that keeps one
    #: deployment's queues, task ids and keys apart from another's on a shared broker.
    broker_url: str | None = Field(default=None, repr=False)
    broker_result_ttl: int = Field(default=3600, ge=10, le=30 * 24 * 3600)
    broker_namespace: str = Field(default="gatekeeper", pattern=r"^[A-Za-z0-9_-]{1,40}$")

    @field_validator(
        "redis_url",
        "broker_url",
        "gatekeeper_bootstrap_admin_key",
        "gatekeeper_encryption_keys",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is a SQLite file."""
        return self.database_url.startswith("sqlite")

    @property
    def is_production(self) -> bool:
        """Whether ``GATEKEEPER_ENV=production``."""
        return self.gatekeeper_env is Environment.PRODUCTION

    def value_cipher(self) -> ValueCipher:
        """The cipher of private values these settings describe (:mod:`app.crypto`)."""
        return cipher_from_settings(
            self.gatekeeper_encryption_keys,
            self.gatekeeper_encryption_key_file,
            production=self.is_production,
        )

    @property
    def result_url(self) -> str | None:
        """Where Celery results live: ``REDIS_URL``, else a Redis ``BROKER_URL``."""
        if self.redis_url:
            return self.redis_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None

    @model_validator(mode="after")
    def _check_broker(self) -> Settings:
        if self.broker_url is None:
            return self
        if not self.broker_url.startswith(("redis://", "rediss://", "amqp://", "amqps://")):
            raise ValueError("BROKER_URL must be a redis://, rediss://, amqp:// or amqps:// URL")
        if self.result_url is None:
            raise ValueError("REDIS_URL is required with an amqp BROKER_URL (results live there)")
        return self

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.gatekeeper_env is not Environment.PRODUCTION:
            return self
        problems = []
        if self.is_sqlite:
            problems.append("DATABASE_URL must point to PostgreSQL in production")
        key = self.gatekeeper_bootstrap_admin_key
        if key is not None and len(key) < 32:
            problems.append("GATEKEEPER_BOOTSTRAP_ADMIN_KEY must be at least 32 characters")
        if self.web_workers > 1 and not self.redis_url:
            problems.append("REDIS_URL is required with several web workers in production")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class SettingsError(ValueError):
    """Invalid configuration; the message never contains the values (they may be secrets)."""


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once from the environment).

    Raises
    ------
    SettingsError
        Naming each bad variable and what is wrong, without echoing any value.
    """
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False, include_context=False):
            where = ".".join(str(p) for p in error["loc"]).upper() or "settings"
            problems.append(f"{where}: {error['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None
