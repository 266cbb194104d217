"""A submit's odometer from the row it read and the columns it writes (``odometer_with``).

It must be the odometer of the row with those columns replaced (``odometer_view`` of
``dataclasses.replace``), for every filter, with and without a lifetime budget, exact or not.
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta

from app.services.objects import odometer_view, odometer_with
from app.store.objects import ObjectState, PrivateValue

DOMAIN = json.dumps(
    {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": 9}]},
    separators=(",", ":"),
)


def _row(rng: random.Random) -> ObjectState:
    filter_ = rng.choice(["bayesian", "simplified", "basic", "approx_bayesian"])
    lifetime = rng.choice([None, 5.0, 12.5])
    accepted = rng.randint(0, 40)
    upper = rng.choice([0.0, 0.5, 1.25, 2.0])
    return ObjectState(
        id="o1",
        domain=DOMAIN,
        value=PrivateValue("not read"),
        budget=rng.choice([1.0, 2.5, 4.0]),
        filter=filter_,
        finite=True,
        state_hash=None,
        state_pending=0,
        history_hash=None,
        state=None,
        state_err=0.0,
        loss_lower=rng.choice([upper, upper - 1e-9 if upper else 0.0]),
        loss_upper=upper,
        basic_total=rng.choice(["0", "1/2", "3", "7/4"]),
        accepted=accepted,
        rejected=rng.randint(0, 5),
        version=accepted + 1,
        updated_at=rng.choice([None, datetime(2026, 1, 2, tzinfo=UTC)]),
        retired_at=None,
        budget_delta=0.05 if filter_ == "approx_bayesian" else None,
        f0_account=rng.choice(["0", "1/4", "40"]),  # F₀'s threshold is 8-10 here
        data_version=rng.randint(1, 3),
        version_start=rng.randint(0, accepted),
        lifetime_budget=lifetime,
        lifetime_exact=rng.choice([None, "3/2"]) if lifetime else None,
        lifetime_lower=1.4 if lifetime else 0.0,
        lifetime_upper=1.5 if lifetime else 0.0,
    )


def test_odometer_with_is_the_changed_rows_odometer() -> None:
    rng = random.Random(27)
    for _ in range(300):
        row = _row(rng)
        upper = rng.choice([0.25, 0.5, 1.0, 3.0])
        changed = {
            "loss_lower": rng.choice([upper, upper - 1e-9]),
            "loss_upper": upper,
            "basic_total": rng.choice(["1/2", "5/2", "11/4"]),
            "f0_account": rng.choice(["1/2", "3/4", "40"]),
            "accepted": row.accepted + 1,
            "updated_at": datetime(2026, 11, 26, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 9)),
        }
        want = odometer_view(dataclasses.replace(row, **changed))  # type: ignore[arg-type]
        got = odometer_with(row, **changed)  # type: ignore[arg-type]
        assert got.model_dump(mode="json", exclude_unset=True) == want.model_dump(
            mode="json", exclude_unset=True
        )
        assert got != odometer_view(row)  # the changed columns were read (accepted, at least)
