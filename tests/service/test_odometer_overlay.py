"""The accepted submit's odometer is read from the row with its new columns copied over.

``app.services.queries._Changed`` copies the odometer's columns (``ODOMETER_COLUMNS``) once;
its definition is the row with those columns replaced (``dataclasses.replace``): every column
and the odometer built from it must be the same, for every kind of object.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from app.services.objects import ODOMETER_COLUMNS, odometer_view
from app.services.queries import _Changed
from app.store.objects import ObjectState

DOMAIN = json.dumps({"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 9}]})


def _row(**overrides: object) -> ObjectState:
    base = {
        "id": "obj-1",
        "domain": DOMAIN,
        "value": None,
        "budget": 2.0,
        "filter": "bayesian",
        "finite": True,
        "state_hash": None,
        "state_pending": 0,
        "history_hash": None,
        "state": None,
        "state_err": 0.0,
        "loss_lower": 0.5,
        "loss_upper": 0.5,
        "basic_total": "1/2",
        "accepted": 3,
        "rejected": 1,
        "version": 7,
        "updated_at": datetime(2026, 11, 26, 20, 0, tzinfo=UTC),
        "retired_at": None,
        "budget_delta": None,
        "f0_account": "0",
        "data_version": 2,
        "version_start": 1,
        "lifetime_budget": None,
        "lifetime_exact": None,
        "lifetime_lower": 0.0,
        "lifetime_upper": 0.0,
    }
    base.update(overrides)
    return ObjectState(**base)  # type: ignore[arg-type]


ROWS = {
    "bayesian, exact": _row(),
    "bayesian, bounds": _row(loss_lower=0.4, loss_upper=0.6),
    "approx_bayesian": _row(filter="approx_bayesian", budget_delta=1e-6, f0_account="1/3"),
    "lifetime, exact": _row(lifetime_budget=5.0, lifetime_exact="3/2"),
    "lifetime, bounds": _row(lifetime_budget=5.0, lifetime_lower=1.25, lifetime_upper=1.5),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_the_overlay_is_the_row_with_its_columns_replaced(name: str) -> None:
    row = ROWS[name]
    changed = {
        "loss_lower": row.loss_lower + 0.25,
        "loss_upper": row.loss_upper + 0.25,
        "basic_total": "3/4",
        "f0_account": "2/3",
        "accepted": row.accepted + 1,
        "updated_at": datetime(2026, 11, 26, 21, 0, tzinfo=UTC) + timedelta(microseconds=1),
    }
    overlay = _Changed(row, changed)
    replaced = dataclasses.replace(row, **changed)  # type: ignore[arg-type]
    for column in ODOMETER_COLUMNS:
        assert getattr(overlay, column) == getattr(replaced, column), column
    assert odometer_view(overlay) == odometer_view(replaced)  # type: ignore[arg-type]
    assert odometer_view(overlay).model_dump_json(exclude_unset=True) == odometer_view(
        replaced
    ).model_dump_json(exclude_unset=True)


def test_the_overlay_holds_every_column_odometer_view_reads() -> None:
    """A column odometer_view reads that ODOMETER_COLUMNS misses fails here, not in a submit."""
    assert set(ODOMETER_COLUMNS) >= {
        "budget",
        "loss_lower",
        "loss_upper",
        "basic_total",
        "accepted",
        "rejected",
        "updated_at",
        "filter",
        "budget_delta",
        "f0_account",
        "domain",
        "version_start",
        "lifetime_budget",
        "lifetime_exact",
        "lifetime_lower",
        "lifetime_upper",
        "data_version",
    }
    with pytest.raises(AttributeError):
        _Changed(ROWS["bayesian, exact"], {}).value  # noqa: B018 - not an odometer column
