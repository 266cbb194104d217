"""The ``gatekeeper`` command line: ``loss FILE|-`` and ``serve``.

Most tests call the command's entry point (``app.cli.main``) in this process, with standard
input, output and error redirected (:func:`run`, defined in ``tests/inprocess.py``): a
``gatekeeper`` process would spend about 0.6-0.8 s of CPU importing before the millisecond of
work these tests check (issue 27 item 5, CI time). :func:`run_process` runs the console script
as a subprocess, for the tests of the installed command itself and of a pipe into it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.inprocess import run_main

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".venv" / "bin" / "gatekeeper"
SENTINEL = "SENTINEL-9137"
SENTINEL_NUMBER = 987654.321


def _command() -> list[str]:
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "app.cli"]


def run_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gatekeeper ARGS`` as a subprocess (the console script when the venv has it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(  # noqa: S603 - fixed argv, no shell
        [*_command(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )


#: ``gatekeeper ARGS`` in this process (the one definition, shared with the service tests).
run = run_main


def _reject_constant(name: str) -> Any:
    raise AssertionError(f"output is not strict JSON: it contains {name}")


def strict_json(text: str) -> Any:
    """Parse JSON refusing NaN/Infinity, which are not JSON."""
    return json.loads(text, parse_constant=_reject_constant)


def write_request(tmp_path: Path, request: Any, name: str = "request.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(request), encoding="utf-8")
    return path


DOMAIN = {
    "attributes": [
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
        {"name": "level", "type": "integer", "low": 0, "high": 4},
    ]
}
PREDICATE = {"attribute": "level", "op": ">=", "value": 2}
EPS = 0.7
K = 8


def rr_history(k: int = K, eps: float = EPS) -> list[dict[str, Any]]:
    """k binary RR answers on one predicate: k/2 ones and k/2 zeros."""
    query = {"mechanism": "binary_rr", "predicate": PREDICATE, "epsilon": eps}
    return [{"query": query, "output": i % 2} for i in range(k)]


def calculator_request(**extra: Any) -> dict[str, Any]:
    return {"domain": DOMAIN, "history": rr_history(), **extra}


CANDIDATE = {
    "mechanism": "binary_rr",
    "predicate": {"attribute": "disease", "op": "in", "value": ["flu", "covid"]},
    "epsilon": 0.9,
}


def check_answer_shape(answer: dict[str, Any], *, with_candidate: bool) -> None:
    """The calculator answer of contract.md (extra keys allowed)."""
    assert isinstance(answer, dict)
    required = {"realized_loss", "basic_composition"} | ({"candidate"} if with_candidate else set())
    assert required <= set(answer)
    allowed = {"realized_loss", "basic_composition", "candidate", "status", "reason"}
    assert set(answer) <= allowed, set(answer) - allowed
    if not with_candidate:
        assert "candidate" not in answer
    loss = answer["realized_loss"]
    assert set(loss) == {"lower", "upper", "exact"}
    for value in (loss["lower"], loss["upper"], answer["basic_composition"]):
        assert isinstance(value, float | int)
        assert not isinstance(value, bool)
        assert math.isfinite(value)
    assert 0.0 <= loss["lower"] <= loss["upper"]
    if "status" in answer:
        assert answer["status"] in {"ok", "limit"}
        # a limit says which (issue 22 item 3); "ok" has no reason
        assert ("reason" in answer) == (answer["status"] == "limit"), answer
    if not with_candidate:
        return
    cand = answer["candidate"]
    assert {"per_output", "worst_case_upper", "accepted"} <= set(cand)
    assert set(cand) <= {
        "per_output",
        "worst_case_upper",
        "accepted",
        "epsilon",
        "per_output_complete",
    }
    assert isinstance(cand["per_output"], list)
    assert cand["per_output"]
    for entry in cand["per_output"]:
        assert {"output", "upper"} <= set(entry)
        assert set(entry) <= {"output", "upper", "lower", "exact"}
        assert math.isfinite(entry["upper"])
        if "lower" in entry:
            assert entry["lower"] <= entry["upper"]
    assert cand["worst_case_upper"] == pytest.approx(max(e["upper"] for e in cand["per_output"]))
    assert set(cand["accepted"]) == {"bayesian", "simplified", "basic"}
    assert all(isinstance(v, bool) for v in cand["accepted"].values())


def check_problem(stderr: str, *, field: str | None) -> dict[str, Any]:
    """A problem JSON on stderr; with ``field``, it names exactly that field."""
    problem = strict_json(stderr)
    assert isinstance(problem, dict)
    assert isinstance(problem.get("type"), str)
    assert problem["type"]
    assert isinstance(problem.get("title"), str)
    if field is not None:
        errors = problem["errors"]
        assert isinstance(errors, list)
        assert errors
        assert errors[0]["field"] == field
        assert isinstance(errors[0]["message"], str)
        assert errors[0]["message"]
    return problem


# --- gatekeeper loss ---------------------------------------------------------------------------
def test_loss_from_file_balanced_rr_history(tmp_path: Path) -> None:
    path = write_request(tmp_path, calculator_request())
    result = run("loss", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=False)
    loss = answer["realized_loss"]
    # k/2 ones and k/2 zeros of the same predicate cancel out: the realized loss is 0 ...
    assert loss["lower"] == pytest.approx(0.0, abs=1e-9)
    assert loss["upper"] == pytest.approx(0.0, abs=1e-9)
    # ... while basic composition charges k * epsilon
    assert answer["basic_composition"] == pytest.approx(K * EPS, rel=1e-12)
    assert loss["upper"] - loss["lower"] <= 1e-4


def test_loss_unbalanced_history_is_the_count_difference_times_epsilon(tmp_path: Path) -> None:
    history = (
        rr_history(6)
        + [
            {
                "query": {"mechanism": "binary_rr", "predicate": PREDICATE, "epsilon": EPS},
                "output": 1,
            }
        ]
        * 3
    )
    path = write_request(tmp_path, {"domain": DOMAIN, "history": history})
    result = run("loss", str(path))
    assert result.returncode == 0, result.stderr
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=False)
    # three more ones than zeros: loss = 3 * epsilon; basic composition = 9 * epsilon
    assert answer["realized_loss"]["lower"] == pytest.approx(3 * EPS, rel=1e-9)
    assert answer["realized_loss"]["upper"] == pytest.approx(3 * EPS, rel=1e-9)
    assert answer["basic_composition"] == pytest.approx(9 * EPS, rel=1e-12)


def test_loss_with_candidate_from_stdin() -> None:
    """Through a pipe into the console script (a subprocess)."""
    request = calculator_request(budget=1.0, candidate=CANDIDATE, options={"tolerance": 1e-6})
    result = run_process("loss", "-", stdin=json.dumps(request))
    assert result.returncode == 0, result.stderr
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=True)
    cand = answer["candidate"]
    assert sorted(e["output"] for e in cand["per_output"]) == [0, 1]
    for entry in cand["per_output"]:
        assert entry["upper"] == pytest.approx(0.9, rel=1e-9)
    assert cand["worst_case_upper"] == pytest.approx(0.9, rel=1e-9)
    # loss 0 + 0.9 <= 1: Bayesian and simplified accept; basic has spent 5.6 already
    assert cand["accepted"] == {"bayesian": True, "simplified": True, "basic": False}
    loss = answer["realized_loss"]
    assert loss["upper"] - loss["lower"] <= 1e-6


def test_loss_candidate_over_budget_is_rejected_by_every_filter(tmp_path: Path) -> None:
    request = calculator_request(budget=0.5, candidate=CANDIDATE)
    result = run("loss", str(write_request(tmp_path, request)))
    assert result.returncode == 0, result.stderr
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=True)
    assert answer["candidate"]["accepted"] == {
        "bayesian": False,
        "simplified": False,
        "basic": False,
    }


def test_loss_stdin_and_file_agree(tmp_path: Path) -> None:
    request = calculator_request(budget=2.0, candidate=CANDIDATE)
    from_file = run("loss", str(write_request(tmp_path, request)))
    from_stdin = run("loss", "-", stdin=json.dumps(request))
    assert from_file.returncode == from_stdin.returncode == 0
    assert strict_json(from_file.stdout) == strict_json(from_stdin.stdout)


def test_loss_pretty_prints_the_same_answer(tmp_path: Path) -> None:
    path = write_request(tmp_path, calculator_request())
    plain = run("loss", str(path))
    pretty = run("loss", "--pretty", str(path))
    assert pretty.returncode == 0, pretty.stderr
    assert "\n  " in pretty.stdout
    assert strict_json(pretty.stdout) == strict_json(plain.stdout)


@pytest.mark.parametrize("tolerance", [1e-3, 1e-6, 1e-9])
def test_loss_bounds_meet_the_tolerance(tmp_path: Path, tolerance: float) -> None:
    history = [
        {"query": {"mechanism": "grr", "attribute": "level", "epsilon": 1.3}, "output": i % 5}
        for i in range(40)
    ] + rr_history(7)
    request = {"domain": DOMAIN, "history": history, "options": {"tolerance": tolerance}}
    result = run("loss", str(write_request(tmp_path, request)))
    assert result.returncode == 0, result.stderr
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=False)
    loss = answer["realized_loss"]
    assert loss["upper"] - loss["lower"] <= tolerance


def test_loss_unreachable_tolerance_is_reported_as_a_limit(tmp_path: Path) -> None:
    """contract.md: upper - lower <= tolerance unless a limit was hit, which the answer says."""
    history = [
        {"query": {"mechanism": "grr", "attribute": "level", "epsilon": 7.3}, "output": i % 5}
        for i in range(200)
    ]
    request = {"domain": DOMAIN, "history": history, "options": {"tolerance": 1e-300}}
    result = run("loss", str(write_request(tmp_path, request)))
    assert result.returncode == 0, result.stderr
    answer = strict_json(result.stdout)
    check_answer_shape(answer, with_candidate=False)
    loss = answer["realized_loss"]
    assert loss["upper"] - loss["lower"] <= 1e-300 or answer.get("status") == "limit"


# --- problems ----------------------------------------------------------------------------------
def test_malformed_request_names_the_field_on_stderr(tmp_path: Path) -> None:
    history = rr_history(2)
    history.append(
        {
            "query": {"mechanism": "binary_rr", "predicate": PREDICATE, "epsilon": SENTINEL},
            "output": 1,
        }
    )
    path = write_request(tmp_path, {"domain": DOMAIN, "history": history})
    result = run("loss", str(path))
    assert result.returncode != 0
    assert result.stdout == ""
    check_problem(result.stderr, field="history[2].query.epsilon")
    assert SENTINEL not in result.stderr


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        pytest.param(
            {"domain": DOMAIN, "history": [], "budget": SENTINEL_NUMBER}, "budget", id="budget"
        ),
        pytest.param(
            {
                "domain": {
                    "attributes": [
                        {"name": "a", "type": "integer", "low": SENTINEL_NUMBER, "high": 3}
                    ]
                },
                "history": [],
            },
            "domain.attributes[0].low",
            id="domain-low",
        ),
        pytest.param(
            {
                "domain": DOMAIN,
                "history": [],
                "budget": 1.0,
                "candidate": {
                    "mechanism": "binary_rr",
                    "predicate": {"attribute": "disease", "op": "==", "value": SENTINEL},
                    "epsilon": 1.0,
                },
            },
            "candidate.predicate.value",
            id="candidate-value",
        ),
        pytest.param(
            {
                "domain": DOMAIN,
                "history": [
                    {
                        "query": {"mechanism": "grr", "attribute": "disease", "epsilon": 1.0},
                        "output": SENTINEL,
                    }
                ],
            },
            "history[0].output",
            id="history-output",
        ),
        pytest.param({"domain": DOMAIN}, "history", id="missing-history"),
        pytest.param({"history": []}, "domain", id="missing-domain"),
        pytest.param(
            {"domain": DOMAIN, "history": [], "SENTINEL_KEY": SENTINEL},
            "SENTINEL_KEY",
            id="unknown-key",
        ),
        pytest.param(
            {"domain": DOMAIN, "history": [], "candidate": CANDIDATE}, "budget", id="no-budget"
        ),
    ],
)
def test_validation_problems(tmp_path: Path, request_: dict[str, Any], field: str) -> None:
    result = run("loss", str(write_request(tmp_path, request_)))
    assert result.returncode != 0
    assert result.stdout == ""
    check_problem(result.stderr, field=field)
    assert SENTINEL not in result.stderr
    assert "987654" not in result.stderr


def test_validation_problem_from_stdin() -> None:
    request = {"domain": {"attributes": []}, "history": []}
    result = run("loss", "-", stdin=json.dumps(request))
    assert result.returncode != 0
    assert result.stdout == ""
    check_problem(result.stderr, field="domain.attributes")


@pytest.mark.parametrize(
    "text",
    [
        '{"domain": ' + f'"{SENTINEL}"',
        f"{SENTINEL}",
        "",
        '{"domain": {}, "history": [1, 2,]}',
    ],
    ids=["truncated", "not-json", "empty", "trailing-comma"],
)
def test_invalid_json(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    for result in (run("loss", str(path)), run("loss", "-", stdin=text)):
        assert result.returncode != 0
        assert result.stdout == ""
        problem = check_problem(result.stderr, field=None)
        assert "json" in (problem["type"] + problem["title"]).lower()
        assert SENTINEL not in result.stderr


def test_missing_file(tmp_path: Path) -> None:
    result = run("loss", str(tmp_path / "does-not-exist.json"))
    assert result.returncode != 0
    assert result.stdout == ""
    problem = check_problem(result.stderr, field=None)
    assert "not found" in (problem["title"] + " " + problem.get("detail", "")).lower()


def test_unsupported_query_on_a_continuous_domain(tmp_path: Path) -> None:
    request = {
        "domain": {
            "attributes": [
                {"name": "age", "type": "real", "low": 10, "high": 100},
                {"name": "sex", "type": "integer", "low": 0, "high": 1},
            ]
        },
        "history": [
            {
                "query": {
                    "mechanism": "binary_rr",
                    "predicate": {"attribute": "age", "op": ">", "value": 40},
                    "epsilon": 1.0,
                },
                "output": 1,
            }
        ],
    }
    result = run("loss", str(write_request(tmp_path, request)))
    assert result.returncode != 0
    assert result.stdout == ""
    problem = check_problem(result.stderr, field="history[0].query")
    text = json.dumps(problem).lower()
    assert "not supported" in text
    # it is not reported as a validation error of the request
    assert problem["type"] != "validation-error"


def test_continuous_domain_answers_with_certified_bounds(tmp_path: Path) -> None:
    request = {
        "domain": {
            "attributes": [
                {"name": "x", "type": "real", "low": -1, "high": 1},
                {"name": "y", "type": "real", "low": -1, "high": 1},
            ]
        },
        "history": [
            {
                "query": {
                    "mechanism": "linear",
                    "weights": {"x": 0.5, "y": 0.5},
                    "range": [-1, 1],
                    "epsilon": 1.0,
                },
                "output": 1,
            },
            {
                "query": {
                    "mechanism": "linear",
                    "weights": {"x": 0.5, "y": 0.5},
                    "range": [-1, 1],
                    "epsilon": 1.0,
                },
                "output": -1,
            },
        ],
        "budget": 2.0,
        "candidate": {"mechanism": "logistic", "weights": {"x": 2.0}, "epsilon": 0.5},
        "options": {"tolerance": 1e-4},
    }
    result = run("loss", str(write_request(tmp_path, request)))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    loss = answer["realized_loss"]
    # two opposite outputs of one query: P ∝ (1 + tE)(1 + (1 - t)E), t = (x + y + 2)/4,
    # E = e - 1; largest at t = 1/2, smallest at t in {0, 1}: the ratio is (e + 1)^2 / (4e)
    expected = math.log((math.e + 1) ** 2 / (4 * math.e))
    assert loss["lower"] <= expected <= loss["upper"]
    assert loss["upper"] - loss["lower"] <= 1e-4
    assert answer["status"] == "ok"
    assert set(answer["candidate"]["accepted"]) == {"bayesian", "simplified", "basic"}
    assert answer["candidate"]["accepted"]["basic"] is False


def test_loss_requires_a_file_argument() -> None:
    result = run("loss")
    assert result.returncode != 0
    assert result.stdout == ""


# --- gatekeeper serve --------------------------------------------------------------------------
def test_serve_documents_its_options() -> None:
    # serving itself is exercised by tests/deploy and tests/service (real servers)
    result = run("serve", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--host", "--port", "--workers"):
        assert option in result.stdout


def test_commands_are_listed() -> None:
    """The installed console script itself (a subprocess)."""
    result = run_process("--help")
    assert result.returncode == 0
    for command in ("serve", "loss", "keys", "verify"):
        assert command in result.stdout


def test_unknown_command_fails() -> None:
    result = run("frobnicate")
    assert result.returncode != 0


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere-7f3.json"
    result = run("loss", str(missing))
    assert result.returncode == 2
    problem = json.loads(result.stderr)
    assert problem["detail"] == f"no such file: {missing}"


def test_a_key_given_twice_is_refused_naming_its_path() -> None:
    request = (
        '{"domain": {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]},'
        ' "history": [{"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.1,'
        ' "epsilon": 50}, "output": 1}]}'
    )
    result = run("loss", "-", stdin=request)
    assert result.returncode == 2, result.stdout
    problem = json.loads(result.stderr)
    assert problem["type"] == "invalid-json"
    assert problem["errors"] == [
        {"field": "history[0].query.epsilon", "message": "is given more than once"}
    ]


@pytest.mark.parametrize("args", [["--help"], ["loss", "--help"], ["keys", "--help"]])
def test_help_is_plain_text(args: list[str]) -> None:
    """``gatekeeper --help`` printed the module docstring's reST markup (``loss``)."""
    result = run(*args)
    assert result.returncode == 0
    assert "``" not in result.stdout
    assert ":func:" not in result.stdout
    assert ":class:" not in result.stdout


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["loss", "-"], json.dumps(calculator_request(budget=2.0, candidate=CANDIDATE))),
        (["loss", "-"], json.dumps({"domain": DOMAIN, "history": [], "budget": -1})),
        (["loss", "-"], "{not json"),
        (["frobnicate"], None),
    ],
    ids=["answer", "invalid-input", "invalid-json", "usage-error"],
)
def test_in_process_runs_answer_as_the_console_script(
    args: list[str], stdin: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`run` (in process) and :func:`run_process` give the same exit code and output."""
    monkeypatch.setenv("COLUMNS", "80")  # argparse's line width, the same on both sides
    here, there = run(*args, stdin=stdin), run_process(*args, stdin=stdin)
    assert (here.returncode, here.stdout, here.stderr) == (
        there.returncode,
        there.stdout,
        there.stderr,
    )
    assert here.stdout or here.stderr
