"""``gatekeeper import``'s worker processes start only for an input worth them (issue 27, 5).

Each ``--jobs`` process is a new interpreter importing the app (about 1-2 s of CPU, far more on
a busy machine) before it parses a line: for a small file it only delays the import. An input
of at most ``--jobs-min-lines`` lines (default 10,000) is parsed in the storing process, as
with ``--jobs 0``; a larger one, or any with ``--jobs-min-lines 0``, starts them. The pool's
own behaviour (file order, a bad line's batch) is tested with ``--jobs-min-lines 0`` in
``test_surveys.py`` and ``test_sealed_versions.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app import cli
from tests.service.conftest import unique_id
from tests.service.factories import integer_domain, run_cli


def batches_of(sizes: list[int]) -> list[Any]:
    """Batches as ``_numbered_batches`` makes them, of ``sizes`` lines."""
    made, number = [], 1
    for size in sizes:
        lines = [(n, b"{}") for n in range(number, number + size)]
        made.append(((number, number + size - 1, 2 * size), lines))
        number += size
    return made


@pytest.mark.parametrize(
    ("sizes", "min_lines", "jobs"),
    [
        ([5, 5], 10, 0),  # exactly the threshold: in this process
        ([5, 5, 1], 10, 2),  # one line more: the workers
        ([10_000], 10_000, 0),
        ([5_000, 5_000, 1], 10_000, 2),
        ([1], 0, 2),  # 0: always
        ([], 0, 0),  # an empty input starts nothing
    ],
)
def test_the_workers_start_above_the_threshold(sizes: list[int], min_lines: int, jobs: int) -> None:
    given = batches_of(sizes)
    chosen, batches = cli._jobs_worth_starting(iter(given), 2, min_lines)
    assert chosen == jobs
    assert list(batches) == given  # every batch, in order, whatever was read ahead


def test_no_jobs_asked_reads_nothing_ahead() -> None:
    def endless() -> Iterator[Any]:
        while True:
            yield batches_of([1])[0]

    chosen, batches = cli._jobs_worth_starting(endless(), 0, 10)
    assert chosen == 0
    assert next(batches) == batches_of([1])[0]


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``jobs`` of every pool the command starts; its jobs run here instead of in processes
    (what the pool computes is tested elsewhere; here only whether one starts). The command
    runs in process (``run_cli``), whose cipher is its own and put back afterwards."""
    started: list[int] = []

    def in_process(
        batches: Iterator[Any],
        jobs: int,
        job: Callable[[Any], Any],
        initializer: Callable[..., None],
        initargs: tuple[Any, ...] = (),
    ) -> Iterator[tuple[Any, Any]]:
        started.append(jobs)
        before = cli._WORKER_ENGINE
        initializer(*initargs)  # here as in each worker: the cipher (and for versions an engine)
        try:
            for item in batches:
                yield item, job(item[1])
        finally:
            if cli._WORKER_ENGINE is not before:
                cli._WORKER_ENGINE.dispose()
                cli._WORKER_ENGINE = before

    monkeypatch.setattr(cli, "_ahead", in_process)
    return started


def write_objects(path: Path, ids: list[str]) -> None:
    path.write_text(
        "".join(
            json.dumps(
                {"id": oid, "domain": integer_domain(), "value": {"x": 1}, "budget": {"epsilon": 1}}
            )
            + "\n"
            for oid in ids
        )
    )


def test_a_small_import_parses_in_process_and_a_larger_one_starts_the_workers(
    tmp_path: Path, postgres_url: str, pools: list[int]
) -> None:
    ids = [unique_id("jobs") for _ in range(12)]
    path = tmp_path / "objects.ndjson"
    write_objects(path, ids)
    args = ["import", str(path), "--batch-size", "5", "--jobs", "2", "--quiet"]
    done = run_cli(*args, database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 12, "existing": 0}
    assert pools == []  # 12 lines: under the default threshold

    done = run_cli(*args, "--jobs-min-lines", "11", database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 0, "existing": 12}
    assert pools == [2]

    done = run_cli(*args, "--jobs-min-lines", "12", database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    assert pools == [2]  # exactly the threshold: none started

    versions = tmp_path / "versions.ndjson"
    versions.write_text("".join(f'{{"id": "{oid}", "value": {{"x": 2}}}}\n' for oid in ids))
    args = ["import", "--versions", str(versions), "--batch-size", "5", "--jobs", "2", "--quiet"]
    done = run_cli(*args, database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 12, "already": 0}
    assert pools == [2]
    done = run_cli(*args, "--jobs-min-lines", "0", database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 0, "already": 12}
    assert pools == [2, 2]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--jobs-min-lines", "-1", "--jobs-min-lines must be 0 or more"),
        ("--jobs", "-1", "--jobs must be 0 or more"),
        ("--batch-size", "0", "--batch-size must be 1.."),
    ],
)
def test_an_unusable_batch_option_is_refused(
    tmp_path: Path, sqlite_url: str, option: str, value: str, message: str
) -> None:
    path = tmp_path / "objects.ndjson"
    write_objects(path, [unique_id("neg")])
    for versions in ([], ["--versions"]):
        done = run_cli("import", *versions, str(path), option, value, database_url=sqlite_url)
        assert done.returncode == 2
        assert message in done.stderr
        assert done.stderr.count("must be") == 1
