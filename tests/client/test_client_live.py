"""The client against a live ``gatekeeper serve``, on SQLite and on PostgreSQL.

The main README's walk-through (keys, register, dry-run, submit and its replay, odometer, the
rejection, then the population survey: import, dry-run, create, follow, responses, cancel) is
run through the sync client and through the async one; every paged list is iterated with pages
small enough to need several; errors arrive as their typed exceptions. The quick start of
clients/python/README.md (its first two ``python`` blocks, read from the file) runs as written,
and runs after the main README's walk-through and survey block (pasted into bash) on one server:
its ids and labels used to be the walk-through's, so it failed there (issue 23, 7).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ldp_gatekeeper_client
import pytest
from ldp_gatekeeper_client import (
    AlreadyExists,
    AsyncClient,
    BinaryRrQuery,
    BudgetExhausted,
    CategoricalAttribute,
    Client,
    Domain,
    Forbidden,
    GrrQuery,
    ImportFailed,
    IntegerAttribute,
    LifetimeExhausted,
    NotFound,
    ObjectRetired,
    Predicate,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
)
from ldp_gatekeeper_client.models import (
    BudgetBody,
    HistoryEntry,
    LifetimeBody,
    LossRequest,
    RegisterRequest,
)

from tests.client.conftest import ADMIN_KEY, QUICK, Server, start_server
from tests.service.conftest import ROOT, ThreadServer, unique_id
from tests.service.test_readme_walkthrough import walkthrough

pytestmark = pytest.mark.slow

#: The README's object: its domain, value and budget.
DOMAIN = Domain(
    attributes=[
        IntegerAttribute(name="age", low=18, high=90),
        CategoricalAttribute(name="disease", values=["none", "flu", "covid"]),
    ]
)
DISEASES = ("none", "flu", "covid")
QUERY = GrrQuery(attribute="disease", epsilon=0.5)
CLIENT_README = ROOT / "clients" / "python" / "README.md"


def population(path: Path, study: str, n: int, *, first: int = 0) -> list[str]:
    """An NDJSON file of ``n`` registrations labelled ``study`` (blank lines in between)."""
    ids = [f"{study}-{i:03d}" for i in range(first, first + n)]
    lines = [
        json.dumps(
            {
                "id": oid,
                "domain": DOMAIN.model_dump(),
                "value": {"age": 20 + i % 50, "disease": DISEASES[i % 3]},
                "budget": {"epsilon": 2.0},
                "labels": {"study": study, "site": "berlin"},
            }
        )
        + ("\n\n" if i % 7 == 3 else "\n")
        for i, oid in enumerate(ids)
    ]
    path.write_text("".join(lines))
    return ids


def analyst_of(admin: Client, server: Server | ThreadServer) -> Client:
    return Client(server.url, admin.keys.create("analyst", label="walk-through").key, retry=QUICK)


def test_the_readme_walkthrough(admin: Client, server: ThreadServer) -> None:
    assert admin.api_version() == ldp_gatekeeper_client.__version__
    assert admin.ready().database == "ok"
    with analyst_of(admin, server) as analyst:
        assert analyst.whoami().role == "analyst"
        oid = unique_id("patient")
        registered = admin.objects.register(
            oid, domain=DOMAIN, value={"age": 34, "disease": "flu"}, budget=1.0
        )
        assert (registered.id, registered.filter, registered.finite) == (oid, "bayesian", True)
        assert registered.odometer.accepted == 0
        assert registered.created_at is not None
        assert registered.created_at.utcoffset() is not None

        decision = analyst.objects.dry_run(oid, QUERY)
        assert decision.decision == "accept"
        assert sorted(o.output for o in decision.per_output) == sorted(DISEASES)
        assert analyst.objects.would_accept(oid, QUERY)

        result = analyst.objects.submit(oid, QUERY, idempotency_key="6f1c0a52")
        assert result.output in DISEASES
        assert not result.replayed
        again = analyst.objects.submit(oid, QUERY, idempotency_key="6f1c0a52")
        assert again.replayed
        assert (again.output, again.query_id) == (result.output, result.query_id)

        odometer = analyst.objects.odometer(oid)
        assert (odometer.accepted, odometer.budget) == (1, 1.0)
        assert odometer.realized_loss.lower <= 0.5 + 1e-9 <= odometer.realized_loss.upper + 2e-9
        assert analyst.objects.odometer_history(oid).points[0].accepted == 1
        assert [item.output for item in analyst.objects.history(oid)] == [result.output]

        # ε 0.5 spent of 1.0: the same output again would make the loss 1.4
        bigger = GrrQuery(attribute="disease", epsilon=0.9)
        assert not analyst.objects.would_accept(oid, bigger)
        with pytest.raises(BudgetExhausted) as refused:
            analyst.objects.submit(oid, bigger)
        error = refused.value
        assert error.worst_case_after is not None
        assert error.worst_case_after > 1.0
        assert sorted(o.output for o in error.per_output) == sorted(DISEASES)
        assert max(o.upper for o in error.per_output) == pytest.approx(error.worst_case_after)
        assert analyst.objects.odometer(oid).rejected == 1
        assert len(list(analyst.objects.history(oid))) == 1


def test_versions_and_lifetime_budgets(admin: Client, server: ThreadServer, tmp_path: Path) -> None:
    """A new version (single and from an NDJSON file, resumably), the lifetime budget's
    refusal as its typed error, and the history of a closed version."""
    binary = Domain(attributes=[IntegerAttribute(name="b", low=0, high=1)])
    rr = BinaryRrQuery(epsilon=0.1, predicate=Predicate(attribute="b", op="==", value=1))
    with analyst_of(admin, server) as analyst:
        oid = unique_id("device")
        admin.objects.register(
            RegisterRequest(
                id=oid,
                domain=binary,
                value={"b": 1},
                budget=BudgetBody(epsilon=0.2),
                lifetime=LifetimeBody(epsilon=0.2),
            )
        )
        first = analyst.objects.submit(oid, rr)
        assert first.version == 1
        assert admin.objects.new_version(oid, {"b": 0}).version == 2
        assert analyst.objects.submit(oid, rr).version == 2  # 0.1 + 0.1 = 0.2: a tie
        with pytest.raises(LifetimeExhausted) as refused:
            analyst.objects.submit(oid, rr)
        assert isinstance(refused.value, BudgetExhausted)
        odometer = analyst.objects.odometer(oid)
        assert odometer.version == 2
        assert odometer.lifetime is not None
        assert odometer.lifetime.realized_loss.exact
        assert odometer.lifetime.remaining == 0.0
        assert [i.seq for i in analyst.objects.history(oid, version=1)] == [first.seq]
        path = tmp_path / "versions.ndjson"
        path.write_text(json.dumps({"id": oid, "value": {"b": 1}}) + "\n")
        done = admin.versions.import_ndjson(path)
        assert (done.created, done.already) == (1, 0)
        again = admin.versions.import_ndjson(path)
        assert (again.created, again.already) == (0, 1)
        assert admin.objects.get(oid).version == 3


def test_reuse_of_identical_answers(admin: Client, server: ThreadServer) -> None:
    """``reuse=True`` on a submit, a dry-run and a survey: the stored answer, typed, and the
    survey's reused count."""
    binary = Domain(attributes=[IntegerAttribute(name="b", low=0, high=1)])
    rr = BinaryRrQuery(epsilon=0.2, predicate=Predicate(attribute="b", op="==", value=1))
    study = unique_id("reuse")
    with analyst_of(admin, server) as analyst:
        ids = [unique_id("reuse") for _ in range(3)]
        for oid in ids:
            admin.objects.register(
                RegisterRequest(
                    id=oid,
                    domain=binary,
                    value={"b": 1},
                    budget=BudgetBody(epsilon=1.0),
                    labels={"study": study},
                )
            )
        first = analyst.objects.submit(ids[0], rr, reuse=True)
        assert not first.reused
        assert analyst.objects.dry_run(ids[0], rr, reuse=True).would_reuse
        hit = analyst.objects.submit(ids[0], rr, reuse=True)
        assert hit.reused
        assert (hit.seq, hit.output, hit.query_id) == (first.seq, first.output, first.query_id)
        assert analyst.objects.odometer(ids[0]).accepted == 1
        dry = analyst.surveys.dry_run("again", rr, labels={"study": study}, reuse=True)
        assert (dry.would_reuse, dry.would_accept) == (1, 3)
        run = analyst.surveys.create("again", rr, labels={"study": study}, reuse=True)
        done = run.wait(timeout=60)
        assert done.reuse
        assert (done.progress.accepted, done.progress.reused) == (3, 1)


def test_odometers_by_keyset_totals_and_the_audit_export(admin: Client) -> None:
    """Odometers listed in id order page after page (keyset), searched by prefix and counted by
    status as the list shows them; the audit export parsed and resumed after an event."""
    binary = Domain(attributes=[IntegerAttribute(name="b", low=0, high=1)])
    study = unique_id("keyset")
    ids = [f"{study}-{i}" for i in range(5)]
    for oid in ids:
        admin.objects.register(
            RegisterRequest(
                id=oid,
                domain=binary,
                value={"b": 1},
                budget=BudgetBody(epsilon=1.0),
                labels={"study": study},
            )
        )
    listed = [o.id for o in admin.odometers.all(labels={"study": study}, page_size=2)]
    assert listed == ids  # three pages of 2, 2, 1, each after the last id of the one before
    assert [o.id for o in admin.odometers.all(id_prefix=f"{study}-3")] == [ids[3]]
    totals = admin.odometers.totals(labels={"study": study})
    assert (totals.objects, totals.active, totals.exhausted, totals.retired) == (5, 5, 0, 0)
    assert [o.id for o in admin.odometers.all(labels={"study": study}, status="exhausted")] == []
    events = admin.audit.export()
    mine = [e for e in events if e.object_id in ids]
    assert [e.object_id for e in mine] == ids  # oldest first
    assert [e.id for e in events] == sorted(e.id for e in events)
    resumed = admin.audit.export(after=mine[2].id)
    assert [e.object_id for e in resumed if e.object_id in ids] == ids[3:]


def test_the_calculator_takes_models(admin: Client) -> None:
    """The loss calculator example of the main README, built from the client's models."""
    x_is_1 = Predicate(attribute="x", op="==", value=1)
    answer = admin.loss(
        LossRequest(
            domain=Domain(attributes=[IntegerAttribute(name="x", low=0, high=1)]),
            history=[
                HistoryEntry(query=BinaryRrQuery(predicate=x_is_1, epsilon=0.5), output=1),
                HistoryEntry(query=BinaryRrQuery(predicate=x_is_1, epsilon=0.5), output=0),
            ],
            budget=1.0,
            candidate=GrrQuery(attribute="x", epsilon=0.9),
        )
    )
    assert answer.status == "ok"
    assert answer.realized_loss.lower == pytest.approx(0.0, abs=1e-9)  # the two answers cancel
    assert answer.basic_composition == pytest.approx(1.0)
    assert answer.candidate is not None
    assert answer.candidate.worst_case_upper == pytest.approx(0.9, abs=1e-6)
    assert answer.candidate.accepted.bayesian
    assert not answer.candidate.accepted.basic


def test_errors_arrive_typed(admin: Client, server: ThreadServer) -> None:
    oid = unique_id("errors")
    admin.objects.register(oid, domain=DOMAIN, value={"age": 40, "disease": "none"}, budget=1.0)
    with pytest.raises(NotFound):
        admin.objects.get("no-such-object")
    with Client(server.url, "not-a-key", retry=QUICK) as stranger, pytest.raises(Unauthorized):
        stranger.objects.odometer(oid)
    created = admin.keys.create("viewer")
    with Client(server.url, created.key, retry=QUICK) as viewer:
        with pytest.raises(Forbidden):
            viewer.objects.submit(oid, QUERY)
        assert admin.keys.revoke(created.id).revoked
        with pytest.raises(Unauthorized):
            viewer.objects.odometer(oid)
    with pytest.raises(ValidationFailed) as invalid:
        admin.objects.dry_run(oid, {"mechanism": "grr", "attribute": "disease", "epsilon": -1})
    assert invalid.value.fields == ["query.epsilon"]
    with pytest.raises(ValidationFailed) as unknown:
        admin.objects.dry_run(oid, GrrQuery(attribute="weight", epsilon=0.5))
    assert unknown.value.fields == ["query.attribute"]
    with pytest.raises(AlreadyExists):
        admin.objects.register(oid, domain=DOMAIN, value={"age": 41, "disease": "flu"}, budget=1.0)
    retired = admin.objects.retire(oid)
    assert retired.status == "retired"
    assert admin.objects.retire(oid).retired_at == retired.retired_at  # so a retry is safe
    with pytest.raises(ObjectRetired):
        admin.objects.submit(oid, QUERY)


def test_the_survey_walkthrough(
    admin: Client, server: ThreadServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = unique_id("flu")
    ids = population(tmp_path / "population.ndjson", study, 25)
    imported = admin.objects.import_ndjson(
        tmp_path / "population.ndjson", batch_size=10, progress=True
    )
    assert (imported.created, imported.existing) == (25, 0)
    assert "import" in capsys.readouterr().err  # the progress bar
    resumed = admin.objects.import_ndjson(tmp_path / "population.ndjson", batch_size=10)
    assert (resumed.created, resumed.existing) == (0, 25)

    # a refused batch names its lines; the batches before it stay stored
    bad = tmp_path / "bad.ndjson"
    more = population(bad, study + "-more", 12)
    lines = bad.read_text().splitlines(keepends=True)
    broken = json.loads(lines[-3])
    broken["budget"] = {"epsilon": -1}
    lines[-3] = json.dumps(broken) + "\n"
    bad.write_text("".join(lines))
    with pytest.raises(ImportFailed) as failed:
        admin.objects.import_ndjson(bad, batch_size=5)
    first_line, last_line = failed.value.first_line, failed.value.last_line
    assert first_line <= len(lines) - 2 <= last_line
    assert failed.value.created == 10
    assert isinstance(failed.value.__cause__, ValidationFailed)
    assert failed.value.__cause__.fields[0].endswith("budget.epsilon")
    assert admin.objects.get(more[9]).id == more[9]
    with pytest.raises(NotFound):
        admin.objects.get(more[10])

    with analyst_of(admin, server) as analyst:
        grr = GrrQuery(attribute="disease", epsilon=1.0)
        dry = analyst.surveys.dry_run("flu", grr, labels={"study": study})
        assert (dry.members, dry.would_accept) == (25, 25)
        run = analyst.surveys.create("flu", grr, labels={"study": study}, idempotency_key="flu-1")
        replay = analyst.surveys.create(
            "flu", grr, labels={"study": study}, idempotency_key="flu-1"
        )
        assert replay.id == run.id
        assert replay.replayed
        final = run.wait(progress=True, timeout=120, poll_interval=0.2)
        assert final.status == "done"
        assert (final.progress.decided, final.progress.accepted) == (25, 25)
        assert final.estimate is not None
        assert final.estimate.kind == "histogram"
        assert f"survey {run.id}" in capsys.readouterr().err  # the progress bar

        responses = list(run.responses(page_size=7))
        assert [r.object_id for r in responses] == sorted(ids)
        assert {r.decision for r in responses} == {"accepted"}
        assert {r.output for r in responses} <= set(DISEASES)
        frame = run.responses_frame()
        assert list(frame.columns) == ["object_id", "decision", "reason", "output"]
        assert len(frame) == 25
        assert list(frame.output) == [r.output for r in responses]

        second = analyst.surveys.create("flu again", grr, ids=ids[:3])
        assert second.view.status == "queued"  # as created
        with pytest.raises(WaitTimeout) as late:
            second.wait(timeout=0)
        assert late.value.survey.id == second.id
        cancelled = second.cancel()
        assert cancelled.status in ("cancelled", "done")  # it may have finished first
        newest = [s.id for s in analyst.surveys.all(page_size=1)]
        assert newest[:2] == [second.id, run.id]

    odometers = list(admin.odometers.all(labels={"study": study}, page_size=4))
    assert sorted(o.id for o in odometers) == sorted(ids)
    table = admin.odometers.frame(labels={"study": study})
    assert len(table) == 25
    # one answer to "flu" each; the three members of the cancelled survey may have given two
    assert set(table.accepted[~table.id.isin(ids[:3])]) == {1}
    assert set(table.accepted) <= {1, 2}
    assert (table.realized_loss_upper <= table.budget).all()
    assert {o.id for o in admin.odometers.all(labels={"study": study}, remaining_lt=1.5)} == set(
        table.id[table.remaining < 1.5]
    )

    created = list(admin.audit.events(kind="survey.created", page_size=1))
    assert len(created) >= 2
    assert len({k.id for k in admin.keys.all(page_size=1)}) >= 2


def test_the_async_client_walks_the_same_road(server: ThreadServer, tmp_path: Path) -> None:
    async def walk() -> dict[str, Any]:
        async with AsyncClient(server.url, ADMIN_KEY, retry=QUICK) as admin:
            oid = unique_id("async")
            await admin.objects.register(
                oid, domain=DOMAIN, value={"age": 50, "disease": "covid"}, budget=1.0
            )
            assert await admin.objects.would_accept(oid, QUERY)
            first = await admin.objects.submit(oid, QUERY, idempotency_key="async-1")
            again = await admin.objects.submit(oid, QUERY, idempotency_key="async-1")
            history = [item async for item in admin.objects.history(oid, page_size=1)]
            points = (await admin.objects.odometer_history(oid, page_size=1)).points
            with pytest.raises(BudgetExhausted):
                await admin.objects.submit(oid, GrrQuery(attribute="disease", epsilon=0.9))
            study = unique_id("async-flu")
            ids = population(tmp_path / "async.ndjson", study, 6)
            await admin.objects.import_ndjson(tmp_path / "async.ndjson", batch_size=4)
            run = await admin.surveys.create(
                "async", GrrQuery(attribute="disease", epsilon=1.0), labels={"study": study}
            )
            final = await run.wait(timeout=120, poll_interval=0.2)
            responses = [r async for r in run.responses(page_size=4)]
            frame = await admin.odometers.frame(labels={"study": study})
            events = [e async for e in admin.audit.events(object_id=oid, page_size=1)]
            keys = [k async for k in admin.keys.all(page_size=1)]
            surveys = [s.id async for s in admin.surveys.all(page_size=1)]
            return {
                "first": first,
                "again": again,
                "history": history,
                "points": points,
                "ids": ids,
                "final": final,
                "responses": responses,
                "frame": frame,
                "events": events,
                "keys": keys,
                "surveys": surveys,
                "run": run.id,
            }

    got = asyncio.run(walk())
    assert got["again"].replayed
    assert got["again"].output == got["first"].output
    assert [item.output for item in got["history"]] == [got["first"].output]
    assert len(got["points"]) == 1
    assert got["final"].status == "done"
    assert sorted(r.object_id for r in got["responses"]) == sorted(got["ids"])
    assert len(got["frame"]) == 6
    assert [e.kind for e in got["events"]] == [
        "object.registered",
        "decision.accepted",
        "decision.rejected",
    ]
    assert len(got["keys"]) >= 1
    assert got["run"] in got["surveys"]


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", CLIENT_README.read_text(), re.S)


def run_the_client_readme(
    server: Server | ThreadServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    """The client README's quick start and survey blocks, as written, against ``server``."""
    monkeypatch.setenv("GATEKEEPER_URL", server.url)
    monkeypatch.setenv("GATEKEEPER_BOOTSTRAP_ADMIN_KEY", ADMIN_KEY)
    quick_start, survey = blocks()[:2]
    namespace: dict[str, Any] = {}
    exec(compile(quick_start, str(CLIENT_README), "exec"), namespace)  # noqa: S102 - our README
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "True"
    assert namespace["result"].output in ("none", "flu", "covid")
    assert "refused; worst case after:" in out
    exec(compile(survey, str(CLIENT_README), "exec"), namespace)  # noqa: S102 - our README
    assert namespace["imported"].created == 60
    assert namespace["survey"].status == "done"
    assert namespace["survey"].progress.accepted == 60
    assert len(namespace["answers"]) == 60
    assert len(namespace["odometers"]) == 60
    return namespace


def test_the_quick_start_runs_as_written(
    server: ThreadServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    run_the_client_readme(server, monkeypatch, capsys)


def main_readme_script(port: int) -> str:
    """The main README's walk-through and survey block for bash, on a server already running.

    Without the lines that start the server (the test's is started with the same admin key);
    ``.venv/bin/gatekeeper`` is this interpreter's ``python -m app.cli``.
    """
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Population surveys", 1)[1]
    surveys = re.search(r"```sh\n(.*?)```", section, re.S)
    assert surveys is not None
    starts = ("export GATEKEEPER_BOOTSTRAP_ADMIN_KEY=", "make run &", "until curl")
    walk = "".join(
        line for line in walkthrough().splitlines(keepends=True) if not line.startswith(starts)
    )
    script = walk + surveys.group(1)
    return script.replace("localhost:8000", f"127.0.0.1:{port}").replace(
        ".venv/bin/gatekeeper", f"{sys.executable} -m app.cli"
    )


def test_the_client_readme_runs_after_the_main_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database_url = f"sqlite:///{tmp_path / 'readmes.db'}"
    server = start_server(
        tmp_path, database_url=database_url, redis_url=None, workers=1, BOUND_PROCESSES="0"
    )
    try:
        monkeypatch.chdir(tmp_path)
        # the main README's population: its survey block asks the study flu-2026
        domain = DOMAIN.model_dump()
        (tmp_path / "population.ndjson").write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"resident-{i:03d}",
                        "domain": domain,
                        "value": {"age": 20 + i, "disease": DISEASES[i % 3]},
                        "budget": {"epsilon": 2.0},
                        "labels": {"study": "flu-2026"},
                    }
                )
                + "\n"
                for i in range(30)
            )
        )
        env = {
            **os.environ,
            "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "DATABASE_URL": database_url,
            "PYTHONPATH": str(ROOT),
        }
        shell = subprocess.run(  # noqa: S603 - the README's own text, on loopback
            ["/bin/bash", "-euo", "pipefail", "-c", main_readme_script(server.port)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert shell.returncode == 0, (shell.stdout[-2000:], shell.stderr[-2000:])
        assert '"id":"patient-17"' in shell.stdout.replace(" ", ""), shell.stdout[-2000:]
        assert '"name":"flu"' in shell.stdout.replace(" ", "")
        capsys.readouterr()
        # then the client's README, on the same server: none of its ids or labels are taken
        namespace = run_the_client_readme(server, monkeypatch, capsys)
        assert {o.id for o in namespace["odometers"].itertuples()} == {
            f"client-demo-{i:03d}" for i in range(60)
        }
    finally:
        server.stop()
