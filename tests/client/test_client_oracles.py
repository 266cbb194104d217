"""The client's decoders agree with the server's: the hash, the sign, support counts, estimates."""

from __future__ import annotations

import doctest
import random

import ldp_gatekeeper_client.oracles as client
import numpy as np
import pytest

from app.engine.domain import parse_domain
from app.engine.estimates import estimate, tally_outputs
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.oracles import default_g, hadamard_sign, olh_hash_value


def test_the_module_examples_run() -> None:
    assert doctest.testmod(client).failed == 0


def test_hash_sign_and_defaults_equal_the_servers() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        seed, index, g = rng.getrandbits(64), rng.randrange(1 << 24), rng.randint(2, 5000)
        assert client.olh_hash(str(seed), index, g) == olh_hash_value(seed, index, g)
        row, column = rng.randrange(1, 1 << 20), rng.randrange(1 << 21)
        assert client.hadamard_sign(row, column) == hadamard_sign(row, column)
    for eps in (0.01, 0.5, 1.0, 3.0, 10.0, 100.0):
        for k in (1, 2, 5, 1000):
            assert client.default_g(eps, k) == default_g(eps, k)


@pytest.mark.parametrize("kind", ["olh", "hadamard"])
def test_client_estimates_equal_the_servers_from_the_same_reports(kind: str) -> None:
    k = 12
    domain = parse_domain({"attributes": [{"name": "v", "type": "integer", "low": 0,
                                           "high": k - 1}]})  # fmt: skip
    mech = parse_query({"mechanism": kind, "attribute": "v", "epsilon": 1.5}, domain)
    outputs = [mech.sample({"v": v % 5}) for v in range(400)]
    server = estimate(mech, len(outputs), tally_outputs(mech, outputs)).value
    assert server is not None
    wire = [mech.output_json(o) for o in outputs]  # what a client reads from the responses
    counts = client.support_counts(mech.to_json(), wire, k)
    found = client.estimate_frequencies(mech.to_json(), counts, len(wire))
    for v, freq in enumerate(found):
        assert freq.value == pytest.approx(server["values"][str(v)], rel=1e-12, abs=1e-12)
        assert freq.stderr == pytest.approx(server["stderr"][str(v)], rel=1e-12, abs=1e-12)
        assert np.allclose(freq.ci95, server["ci95"][str(v)], rtol=1e-12, atol=1e-12)
