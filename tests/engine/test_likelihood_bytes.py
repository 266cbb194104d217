"""A stored likelihood array read back: the decode's skipped shift is bit-identical (issue 27).

``LikelihoodState`` shifts an array so that its maximum is 0; a stored array's maximum is +0.0
already, and the shift is skipped then (subtracting +0.0 changes no float64). These compare the
decode with the one it replaced — the bytes sliced, copied, shifted by their maximum — bit for
bit, on stored states and on arrays whose maximum is -0.0, positive, NaN, or +0.0 beside -0.0.
"""

from __future__ import annotations

import math
import random

import numpy as np

from app.engine.domain import parse_domain
from app.engine.exact import MAGIC
from app.engine.likelihood import LikelihoodState
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 4},
        {"name": "region", "type": "categorical", "values": ["a", "b", "c"]},
    ]
}


def _decoded_as_before(shape: tuple[int, ...], data: bytes) -> tuple[np.ndarray, float]:
    """The decode before the shortcut: a slice of the bytes, copied, shifted by its maximum."""
    size = 8 * math.prod(shape)
    logp = np.array(np.frombuffer(data[:size], dtype="<f8"), dtype=np.float64).reshape(shape)
    logp -= logp.max()
    return logp, float(logp.min())


def _bits(x: float) -> bytes:
    return np.float64(x).tobytes()


def test_a_decoded_array_is_the_shifted_one_bit_for_bit() -> None:
    limits = EngineLimits()
    domain = parse_domain(DOMAIN, limits=limits)
    shape = domain.shape
    rng = random.Random(41)
    mechs = [
        (
            attribute,
            parse_query(
                {"mechanism": "grr", "attribute": attribute, "epsilon": epsilon},
                domain,
                limits=limits,
            ),
        )
        for attribute in ("age", "region")
        for epsilon in (0.5, 0.25, 1.3)
    ]
    arrays: list[bytes] = []
    for _ in range(60):  # stored states (to_bytes: the exact part after the array)
        state = LikelihoodState(domain)
        for _ in range(rng.randint(1, 8)):
            attribute, mech = rng.choice(mechs)
            output = rng.choice([0, 1, 2]) if attribute == "age" else rng.choice("abc")
            state = state.applied(mech.term(mech.parse_output(output, "o")))
        arrays.append(state.to_bytes())
    size = math.prod(shape)
    special = [
        np.full(size, -0.0),  # maximum -0.0: the shift makes every entry +0.0
        np.array([-0.0] * (size - 3) + [-1.5, -2.0, -0.25]),
        np.array([0.0, -0.0] * (size // 2) + [-0.0] * (size % 2)),  # +0.0 beside -0.0
        np.array([-0.0, 0.0] * (size // 2) + [0.0] * (size % 2)),
        np.array([0.0] + [-math.inf] * (size - 2) + [-5e-324]),  # infinities, a subnormal
        np.array([3.5] + [rng.uniform(-4, 4) for _ in range(size - 1)]),  # a positive maximum
        np.array([-1.0] + [rng.uniform(-4, -1) for _ in range(size - 1)]),  # a negative one
        np.array([math.nan] + [0.0] * (size - 1)),  # NaN: the maximum is NaN
    ]
    arrays += [a.astype("<f8").tobytes() for a in special]
    arrays += [a.astype("<f8").tobytes() + MAGIC + b'{"g":[],"c":{}}' for a in special[:3]]
    plus = minus = 0
    for data in arrays:
        expected, low = _decoded_as_before(shape, data)
        state = LikelihoodState.from_bytes(domain, data, 0.25)
        assert state.logp.dtype == np.float64
        assert state.logp.shape == shape
        assert state.logp.tobytes() == expected.tobytes()
        assert _bits(state.computed_loss) == _bits(-low)
        top = np.frombuffer(data, dtype="<f8", count=size).max()
        plus += top == 0.0 and math.copysign(1.0, top) > 0
        minus += top == 0.0 and math.copysign(1.0, top) < 0
        # the state's own array: writable, sharing nothing with the stored bytes
        assert state.logp.flags.writeable
        assert not np.shares_memory(state.logp, np.frombuffer(data, dtype=np.uint8))
        before = bytes(data)
        age = mechs[0][1]
        state.apply(age.term(age.parse_output(1, "o")))
        assert data == before
    assert plus >= 60  # every stored state's maximum is +0.0 (the skipped shift)
    assert minus >= 2  # and the -0.0 maxima were met (the shift kept)
