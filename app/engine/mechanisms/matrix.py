"""``matrix``: an explicit conditional distribution over a finite domain.

``probabilities[i][j] = Pr(outputs[j] | point i)`` with rows in the domain's point order. Rows
must be non-negative and sum to 1 (within ``1e-9``); they are renormalised in float64 so that the
accounted log-probabilities and the sampler use the same distribution. An output whose column is
zero everywhere can never occur and is dropped; a column that is zero for some points but not
others makes the mechanism non-private for every finite ε and is rejected. The tight ε is
``max_j (max_i log p_ij - min_i log p_ij)``; a declared ``epsilon`` is optional and, if given, must
not be lower than that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.engine.domain import Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_list, as_number, check_keys, path
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import Output, TabulatedMechanism, check_epsilon, output_index
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray
from app.engine.sampling import categorical, dyadic_weights

ROW_SUM_TOLERANCE = 1e-9


def _parse_probabilities(raw: Any, field: str, rows: int, cols: int) -> FloatArray:
    items = as_list(raw, field)
    if len(items) != rows:
        raise InvalidInput(
            field,
            f"must have one row per domain point, in the domain's order: {rows} row(s), "
            f"not {len(items)}",
        )
    for i, row in enumerate(items):
        row_items = as_list(row, path(field, i))
        if len(row_items) != cols:
            raise InvalidInput(
                path(field, i),
                f"must have one probability per output: {cols}, not {len(row_items)}",
            )
    try:
        if not all(type(v) in (int, float) for row in items for v in row):
            raise TypeError
        matrix = np.array(items, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        for i, row in enumerate(items):
            for j, v in enumerate(row):
                as_number(v, path(path(field, i), j))
        raise InvalidInput(field, "must contain only numbers") from None
    bad = ~np.isfinite(matrix) | (matrix < 0)
    if bad.any():
        i, j = (int(t) for t in np.argwhere(bad)[0])
        raise InvalidInput(path(path(field, i), j), "must be a finite number between 0 and 1")
    sums = matrix.sum(axis=1)
    off = np.abs(sums - 1.0) > ROW_SUM_TOLERANCE
    if off.any():
        raise InvalidInput(path(field, int(np.argmax(off))), "must sum to 1")
    return np.asarray(matrix / sums[:, None], dtype=np.float64)


class MatrixMechanism(TabulatedMechanism):
    """``matrix``: rows are domain points, columns are outputs."""

    kind = "matrix"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(
            raw, field, required=("mechanism", "outputs", "probabilities"), optional=("epsilon",)
        )
        if not domain.is_finite:
            raise InvalidInput(path(field, "mechanism"), "matrix queries need a finite domain")
        outputs_field = path(field, "outputs")
        outputs = as_list(raw["outputs"], outputs_field, min_len=1, max_len=limits.max_outputs)
        seen: set[Any] = set()
        for j, out in enumerate(outputs):
            if (
                isinstance(out, bool)
                or not isinstance(out, (str, int, float))
                or (isinstance(out, float) and not math.isfinite(out))
            ):
                raise InvalidInput(path(outputs_field, j), "must be a string or a finite number")
            if out in seen:
                raise InvalidInput(path(outputs_field, j), "duplicates an earlier output")
            seen.add(out)
        if domain.size * len(outputs) > limits.max_matrix_entries:
            raise InvalidInput(
                path(field, "probabilities"),
                f"must have at most {limits.max_matrix_entries} entries",
            )
        probs = _parse_probabilities(
            raw["probabilities"], path(field, "probabilities"), domain.size, len(outputs)
        )
        zero = probs == 0.0
        partly_zero = zero.any(axis=0) & ~zero.all(axis=0)
        if partly_zero.any():
            j = int(np.argmax(partly_zero))
            raise InvalidInput(
                path(outputs_field, j),
                "has probability 0 for some points and not for others, so the query is not "
                "ε-LDP for any finite ε",
            )
        self.valid = np.flatnonzero(~zero.all(axis=0))
        self.all_outputs = outputs
        self.probabilities = np.ascontiguousarray(probs[:, self.valid])
        self.axes = tuple(range(len(domain.shape)))
        with np.errstate(divide="ignore"):
            logs = np.log(self.probabilities)
        tight = float((logs.max(axis=0) - logs.min(axis=0)).max())
        if tight > limits.max_epsilon:
            raise InvalidInput(
                path(field, "probabilities"),
                f"give the query an epsilon above the limit of {limits.max_epsilon:g}",
            )
        declared = None
        if "epsilon" in raw:
            declared = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self._logs = logs
        super().__init__(domain, declared, tight, field)
        self._output_index = {out: n for n, out in enumerate(outputs[j] for j in self.valid)}

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON (outputs that can never occur keep their zero column)."""
        full = np.zeros((self.domain.size, len(self.all_outputs)))
        full[:, self.valid] = self.probabilities
        out: dict[str, Any] = {
            "mechanism": self.kind,
            "outputs": list(self.all_outputs),
            "probabilities": full.tolist(),
        }
        if self.declared_epsilon is not None:
            out["epsilon"] = self.declared_epsilon
        return out

    @property
    def output_count(self) -> int:
        """Outputs with non-zero probability."""
        return int(self.valid.size)

    @property
    def extra_error(self) -> float:
        """Normalising the exact dyadic weights of a row errs by up to one ulp per output."""
        return 2.0 * UNIT_ROUNDOFF * self.output_count

    def parse_output(self, raw: Any, field: str) -> Output:
        """One of ``outputs`` that can occur."""
        if (
            isinstance(raw, bool)
            or not isinstance(raw, (str, int, float))
            or raw not in self._output_index
        ):
            raise InvalidInput(field, "must be one of the query's possible outputs")
        return self._output_index[raw]

    def output_json(self, output: Output) -> Any:
        """The output as declared."""
        return self.all_outputs[int(self.valid[output_index(output)])]

    def log_table(self) -> FloatArray:
        """``log p`` reshaped to the domain grid plus an output axis."""
        return np.asarray(
            self._logs.reshape(*self.domain.shape, self.output_count), dtype=np.float64
        )

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Draw a column of the value's row with exact dyadic weights."""
        row = self.probabilities[self.domain.point_index(value)]
        return categorical(dyadic_weights(row.tolist()))
