"""The asynchronous client (:class:`AsyncClient`), on :class:`httpx.AsyncClient`.

The same operations as :class:`~ldp_gatekeeper_client.Client`, awaited; paged lists are async
iterators (``async for item in client.objects.history(object_id)``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx
from tqdm import tqdm

from ldp_gatekeeper_client import _ops, frames, models
from ldp_gatekeeper_client._core import DEFAULT_RETRY, USER_AGENT, Call, Pager, RetryPolicy
from ldp_gatekeeper_client._core import retry_wait as _retry_wait
from ldp_gatekeeper_client.errors import (
    ApiError,
    ConnectionFailed,
    SurveyFailed,
    WaitTimeout,
    error_from_response,
)

T = TypeVar("T")


class AsyncClient:
    """An asyncio client of one gatekeeper service, for one API key.

    Takes the parameters of :class:`~ldp_gatekeeper_client.Client` (``http_client`` an
    :class:`httpx.AsyncClient`). Use it with ``async with``, or ``await client.aclose()``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 60.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._owned = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._http.base_url = httpx.URL(base_url)
        self._http.headers["User-Agent"] = USER_AGENT
        if api_key is not None:
            self._http.headers["Authorization"] = f"Bearer {api_key}"
        self.retry = retry
        self.objects = AsyncObjects(self)
        self.versions = AsyncVersions(self)
        self.odometers = AsyncOdometers(self)
        self.surveys = AsyncSurveys(self)
        self.keys = AsyncKeys(self)
        self.projects = AsyncProjects(self)
        self.audit = AsyncAudit(self)

    # ------------------------------------------------------------------------------ plumbing
    async def _run(self, call: Call[T]) -> T:
        """Send ``call``, retrying as :class:`RetryPolicy` allows; its parsed answer."""
        retry = 0
        while True:
            try:
                response = await self._http.send(call.request(self._http))
            except httpx.TransportError as exc:
                wait = _retry_wait(self.retry, call, retry, failure=exc)
                if wait is None:
                    raise ConnectionFailed(
                        f"{call.method} {call.path}: {type(exc).__name__}: {exc}"
                    ) from exc
            else:
                if response.status_code < 400:
                    return call.parse(response)
                error = error_from_response(response)
                wait = _retry_wait(self.retry, call, retry, error=error)
                if wait is None:
                    raise error
            await asyncio.sleep(wait)
            retry += 1

    async def _iterate(self, pager: Pager[T]) -> AsyncIterator[T]:
        cursor = pager.first
        while True:
            items, cursor = pager.split(await self._run(pager.page(cursor)))
            for item in items:
                yield item
            if cursor is None:
                return

    async def aclose(self) -> None:
        """Close the connections (unless the httpx client was given)."""
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------- one-off calls
    async def loss(self, request: models.LossRequest | Mapping[str, Any]) -> models.LossResult:
        """The stateless loss calculator (``POST /v1/loss``)."""
        return await self._run(_ops.loss(request))

    async def whoami(self) -> models.WhoAmI:
        """The calling key's id and role."""
        return await self._run(_ops.whoami())

    async def health(self) -> models.Health:
        """``GET /healthz``: the process is up."""
        return await self._run(_ops.health())

    async def ready(self) -> models.Ready:
        """``GET /readyz``: the database (and Redis) answer."""
        return await self._run(_ops.ready())

    async def api_version(self) -> str:
        """The server's API version (its OpenAPI ``info.version``)."""
        return await self._run(_ops.api_version())


class AsyncObjects:
    """Protected objects: register, dry-run, submit, history, odometers, imports."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def register(
        self,
        object_id: str | _ops.RegistrationLike,
        *,
        domain: models.Domain | Mapping[str, Any] | None = None,
        value: Mapping[str, models.Scalar] | None = None,
        budget: float | None = None,
        filter: str = "bayesian",
        labels: Mapping[str, str] | None = None,
    ) -> models.ObjectView:
        """Register an object (admin); see :meth:`Client.objects.register <.Objects.register>`."""
        body = _ops.registration(object_id, domain, value, budget, filter, labels)
        return await self._c._run(_ops.register(body))

    async def get(self, object_id: str) -> models.ObjectView:
        """An object's metadata and odometer (never its value)."""
        return await self._c._run(_ops.get_object(object_id))

    async def retire(self, object_id: str) -> models.ObjectView:
        """Retire an object (admin): it answers no more queries; its history is kept."""
        return await self._c._run(_ops.retire(object_id))

    async def new_version(
        self, object_id: str, value: Mapping[str, models.Scalar]
    ) -> models.VersionCreated:
        """Give the object a new value (admin); its current version is closed, history kept.

        Later queries read the new value under a fresh per-version filter. Not retried once
        sent (a retry could make a second version): ``versions.create`` takes a key.
        """
        return await self._c._run(_ops.new_version(object_id, value))

    async def dry_run(
        self, object_id: str, query: _ops.QueryLike, *, reuse: bool = False
    ) -> models.Decision:
        """Would the object's filter accept ``query`` now? Spends nothing."""
        return await self._c._run(_ops.dry_run(object_id, query, reuse))

    async def would_accept(self, object_id: str, query: _ops.QueryLike) -> bool:
        """True when a dry-run of ``query`` says the filter would accept it now."""
        return (await self.dry_run(object_id, query)).accepted

    async def submit(
        self,
        object_id: str,
        query: _ops.QueryLike,
        *,
        idempotency_key: str | None = None,
        reuse: bool = False,
    ) -> models.SubmitResult:
        """Run ``query`` with one Idempotency-Key for every retry (never spends twice)."""
        return await self._c._run(_ops.submit(object_id, query, idempotency_key, reuse))

    def history(
        self, object_id: str, *, page_size: int = 1000, version: int | None = None
    ) -> AsyncIterator[models.HistoryItem]:
        """The object's accepted queries and outputs, oldest first (an analyst: its own)."""
        return self._c._iterate(_ops.history(object_id, page_size, version))

    async def odometer(self, object_id: str) -> models.Odometer:
        """The object's odometer: certified loss bounds, remaining budget, counts."""
        return await self._c._run(_ops.odometer(object_id))

    async def odometer_history(
        self, object_id: str, *, page_size: int = 10_000, version: int | None = None
    ) -> models.OdometerHistory:
        """The loss after every accepted query and the rejections between (every page)."""
        pager = _ops.odometer_history(object_id, page_size, version)
        pages = [p async for p in self._c._iterate(pager)]
        return _ops.merge_odometer_history(pages)

    async def import_objects(
        self,
        registrations: Sequence[_ops.RegistrationLike],
        *,
        idempotency_key: str | None = None,
    ) -> models.ImportResult:
        """Register up to 10,000 objects in one all-or-nothing request (admin)."""
        return await self._c._run(_ops.import_json(registrations, idempotency_key))

    async def import_ndjson(
        self, path: str | os.PathLike[str], *, batch_size: int = 5000, progress: bool = False
    ) -> models.ImportResult:
        """Register the objects of an NDJSON file in batches; see the sync client's."""
        upload_of = _ops.ndjson_upload(
            path, batch_size, desc="import", second="existing", progress=progress
        )
        with upload_of as (batches, upload):
            for batch in batches:
                try:
                    result = await self._c._run(_ops.ndjson_import(batch))
                except ApiError as exc:
                    raise upload.failed(batch, exc) from exc
                upload.add(batch, created=result.created, existing=result.existing)
        return models.ImportResult(created=upload.created, existing=upload.existing)


class AsyncVersions:
    """New data versions of many objects (``POST /v1/versions``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, items: Sequence[_ops.VersionLike], *, idempotency_key: str | None = None
    ) -> models.VersionsResult:
        """New values of up to 10,000 objects, all or nothing (admin), retried with one key."""
        return await self._c._run(_ops.import_versions(items, idempotency_key))

    async def import_ndjson(
        self, path: str | os.PathLike[str], *, batch_size: int = 5000, progress: bool = False
    ) -> models.VersionsImported:
        """New values from an NDJSON file (``{"id", "value"}`` a line), in batches.

        Each batch is one all-or-nothing request whose Idempotency-Key is its content's hash:
        sending the same file again after an interruption replays the batches already stored
        (counted in ``already``) and creates the rest. A refused batch raises
        :class:`~.errors.ImportFailed` naming its lines; the batches before it stay stored.
        """
        upload_of = _ops.ndjson_upload(
            path, batch_size, desc="versions", second="already", progress=progress
        )
        with upload_of as (batches, upload):
            for batch in batches:
                try:
                    result = await self._c._run(_ops.ndjson_versions(batch))
                except ApiError as exc:
                    raise upload.failed(batch, exc) from exc
                replayed = result.created if result.replayed else 0
                upload.add(batch, created=result.created - replayed, existing=replayed)
        return models.VersionsImported(created=upload.created, already=upload.existing)


class AsyncOdometers:
    """Every object's odometer (``GET /v1/odometers``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def all(
        self,
        *,
        remaining_lt: float | None = None,
        remaining_gt: float | None = None,
        include_retired: bool = False,
        labels: Mapping[str, str] | None = None,
        page_size: int = 1000,
        id_prefix: str | None = None,
        status: models.OdometerStatus | None = None,
    ) -> AsyncIterator[models.OdometerSummary]:
        """Every matching object's odometer in id order (``labels``: all must match).

        ``id_prefix``: ids starting with it; ``status``: ``active``, ``exhausted``,
        ``near_exhaustion`` or ``retired``.
        """
        return self._c._iterate(
            _ops.odometers(
                page_size=page_size,
                remaining_lt=remaining_lt,
                remaining_gt=remaining_gt,
                include_retired=include_retired,
                labels=labels,
                id_prefix=id_prefix,
                status=status,
            )
        )

    async def totals(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        id_prefix: str | None = None,
        include_retired: bool = False,
    ) -> models.OdometerTotals:
        """How many objects match, by status (the dashboard's cards, the gauges' definitions)."""
        return await self._c._run(
            _ops.odometer_totals(
                labels=labels, id_prefix=id_prefix, include_retired=include_retired
            )
        )

    async def frame(
        self,
        *,
        remaining_lt: float | None = None,
        remaining_gt: float | None = None,
        include_retired: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> Any:
        """:meth:`all` as a pandas DataFrame (needs the ``pandas`` extra)."""
        items = [
            item
            async for item in self.all(
                remaining_lt=remaining_lt,
                remaining_gt=remaining_gt,
                include_retired=include_retired,
                labels=labels,
            )
        ]
        return frames.odometers_frame(items)


class AsyncSurveyRun:
    """A created survey: follow it (:meth:`wait`), read its responses, cancel it."""

    def __init__(self, client: AsyncClient, view: models.SurveyView) -> None:
        self._c = client
        self.view = view

    @property
    def id(self) -> int:
        """The survey's id."""
        return self.view.id

    @property
    def replayed(self) -> bool:
        """True when the creation was a retry answered with the survey created first."""
        return self.view.replayed

    async def refresh(self) -> models.SurveyView:
        """Read the survey's status, progress and estimate again."""
        self.view = await self._c.surveys.get(self.id)
        return self.view

    async def wait(
        self, *, progress: bool = False, timeout: float | None = None, poll_interval: float = 1.0
    ) -> models.SurveyView:
        """Poll until the survey is done or cancelled; see the sync client's ``wait``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = min(0.1, poll_interval)
        with tqdm(
            total=self.view.progress.total,
            unit="member",
            desc=f"survey {self.id}",
            disable=not progress,
        ) as bar:
            while True:
                bar.update(self.view.progress.decided - bar.n)
                bar.set_postfix(accepted=self.view.progress.accepted, status=self.view.status)
                if self.view.finished:
                    break
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise WaitTimeout(self.view, float(timeout or 0.0))
                await asyncio.sleep(pause)
                pause = min(poll_interval, pause * 1.5)
                await self.refresh()
        if self.view.status == "failed":
            raise SurveyFailed(self.view)
        return self.view

    async def cancel(self) -> models.SurveyView:
        """Cancel: members not yet decided are not queried; accepted answers stay."""
        self.view = await self._c.surveys.cancel(self.id)
        return self.view

    def responses(self, *, page_size: int = 1000) -> AsyncIterator[models.SurveyResponse]:
        """Each member's decision (and output, for the survey's analyst and admins)."""
        return self._c.surveys.responses(self.id, page_size=page_size)

    async def responses_frame(self) -> Any:
        """The responses as a pandas DataFrame (needs the ``pandas`` extra)."""
        return frames.responses_frame([item async for item in self.responses()])


class AsyncSurveys:
    """Population surveys: one query to every member of a cohort."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        name: str,
        query: _ops.QueryLike,
        *,
        labels: Mapping[str, str] | None = None,
        ids: Sequence[str] | None = None,
        cohort: _ops.CohortLike | None = None,
        idempotency_key: str | None = None,
        reuse: bool = False,
    ) -> AsyncSurveyRun:
        """Start a survey (analyst); a retry never creates a second one."""
        body = _ops.survey_body(name, query, labels=labels, ids=ids, cohort=cohort, reuse=reuse)
        view = await self._c._run(_ops.create_survey(body, idempotency_key))
        return AsyncSurveyRun(self._c, view)

    async def dry_run(
        self,
        name: str,
        query: _ops.QueryLike,
        *,
        labels: Mapping[str, str] | None = None,
        ids: Sequence[str] | None = None,
        cohort: _ops.CohortLike | None = None,
        reuse: bool = False,
    ) -> models.SurveyDryRun:
        """How the survey would go now (members, would accept, refusals), spending nothing."""
        body = _ops.survey_body(name, query, labels=labels, ids=ids, cohort=cohort, reuse=reuse)
        return await self._c._run(_ops.survey_dry_run(body))

    async def get(self, survey_id: int) -> models.SurveyView:
        """A survey's status, progress and estimate."""
        return await self._c._run(_ops.get_survey(survey_id))

    async def run(self, survey_id: int) -> AsyncSurveyRun:
        """An :class:`AsyncSurveyRun` of an existing survey."""
        return AsyncSurveyRun(self._c, await self.get(survey_id))

    async def cancel(self, survey_id: int) -> models.SurveyView:
        """Cancel a survey (its analyst or an admin)."""
        return await self._c._run(_ops.cancel_survey(survey_id))

    def all(self, *, page_size: int = 200) -> AsyncIterator[models.SurveyView]:
        """Every survey the key may see, newest first."""
        return self._c._iterate(_ops.surveys(page_size))

    def responses(
        self, survey_id: int, *, page_size: int = 1000
    ) -> AsyncIterator[models.SurveyResponse]:
        """Each member's decision, in object-id order."""
        return self._c._iterate(_ops.survey_responses(survey_id, page_size))

    async def responses_frame(self, survey_id: int) -> Any:
        """The responses as a pandas DataFrame (needs the ``pandas`` extra)."""
        return frames.responses_frame([item async for item in self.responses(survey_id)])


class AsyncKeys:
    """API keys (admin)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, role: models.Role, *, label: str | None = None, project: str | None = None
    ) -> models.CreatedKey:
        """A new key (in ``project``: its scope and quota); its secret is shown this once."""
        return await self._c._run(_ops.create_key(role, label, project))

    def all(self, *, page_size: int = 1000) -> AsyncIterator[models.KeyInfo]:
        """Every key's public facts (never a secret), by id."""
        return self._c._iterate(_ops.keys(page_size))

    async def revoke(self, key_id: int) -> models.RevokedKey:
        """Revoke a key (the last active admin key cannot be: LastAdminKey)."""
        return await self._c._run(_ops.revoke_key(key_id))


class AsyncProjects:
    """Projects (admin): tenants with a label scope and an ε quota, inherited by their keys."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, name: str, *, labels: Mapping[str, str], quota: float
    ) -> models.ProjectView:
        """A new project: its keys see only objects carrying ``labels``, within ``quota``."""
        return await self._c._run(_ops.create_project(name, labels, quota))

    async def get(self, name: str) -> models.ProjectView:
        """A project's scope and quota."""
        return await self._c._run(_ops.get_project(name))

    async def set_quota(self, name: str, quota: float) -> models.ProjectView:
        """Change a project's quota (its scope is fixed)."""
        return await self._c._run(_ops.set_quota(name, quota))

    async def delete(self, name: str) -> None:
        """Delete a project: its keys are revoked; its name stays taken, its loss on record."""
        await self._c._run(_ops.delete_project(name))

    def all(self, *, page_size: int = 1000) -> AsyncIterator[models.ProjectView]:
        """Every project, in creation order."""
        return self._c._iterate(_ops.projects(page_size))


class AsyncAudit:
    """The audit log (admin)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def events(
        self,
        *,
        object_id: str | None = None,
        kind: models.AuditKind | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[models.AuditEvent]:
        """Every event (filtered by object and kind), oldest first."""
        return self._c._iterate(_ops.audit(object_id, kind, page_size))

    async def export(
        self, *, after: int | None = None, since: str | None = None
    ) -> list[models.AuditEvent]:
        """The log from after event ``after`` (or from RFC 3339 time ``since``), oldest first.

        One request: resume a long export with ``after`` = the last event's id.
        """
        return await self._c._run(_ops.audit_export(after, since))
