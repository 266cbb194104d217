"""A survey chunk's draws at once (issue 26): one generator call, each draw still exact.

:func:`app.engine.sampling.words`, :func:`~app.engine.sampling.randbelow_array`,
:meth:`~app.engine.sampling.RealProbability.draw_many` and ``olh``'s ``sample_many`` are checked
exactly where the bytes can be fixed (which words are kept, rejected, refined) and by
chi-square goodness-of-fit tests at p > 1e-6 (as in test_sampling.py) where they cannot.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from app.engine import sampling
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.oracles import olh_hash_value

P_MIN = 1e-6


def _fixed_bytes(monkeypatch: pytest.MonkeyPatch, words: list[int]) -> list[int]:
    """Make ``secrets.token_bytes`` return ``words`` (little-endian, in order); calls' sizes."""
    left = list(words)
    calls: list[int] = []

    def token_bytes(size: int) -> bytes:
        calls.append(size)
        taken = [left.pop(0) for _ in range(size // 8)]
        return struct.pack(f"<{len(taken)}Q", *taken)

    monkeypatch.setattr(sampling.secrets, "token_bytes", token_bytes)
    return calls


def test_words_are_one_generator_call_read_little_endian(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fixed_bytes(monkeypatch, [0, 1, 2**64 - 1, 2**63])
    assert sampling.words(4).tolist() == [0, 1, 2**64 - 1, 2**63]
    assert calls == [32]
    assert sampling.words(0).tolist() == []


def test_randbelow_array_keeps_the_top_bits_below_n_and_redraws_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # n = 5: 3 bits from the top of each word; 7, 5 and 6 are rejected and redrawn
    top = 64 - 3
    first = [7 << top, (3 << top) | 99, 5 << top, 0]
    second = [4 << top, 6 << top]
    third = [(2 << top) | (2**top - 1)]
    calls = _fixed_bytes(monkeypatch, first + second + third)
    assert sampling.randbelow_array(5, 4).tolist() == [4, 3, 2, 0]
    assert calls == [32, 16, 8]  # one call per round, for the positions still rejected


def test_randbelow_array_one_value_costs_nothing_and_refuses_bad_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fixed_bytes(monkeypatch, [])
    assert sampling.randbelow_array(1, 3).tolist() == [0, 0, 0]
    assert calls == []
    for bad in (0, 2**63 + 1):
        with pytest.raises(ValueError, match="n must"):
            sampling.randbelow_array(bad, 1)


@pytest.mark.parametrize("n", [2, 3, 6, 7, 255, 256, 257, 1000, 2**63])
def test_randbelow_array_is_uniform(n: int) -> None:
    draws = [int(d) for d in sampling.randbelow_array(n, 12_000)]
    assert min(draws) >= 0
    assert max(draws) < n
    bins = min(n, 12)
    counts = Counter(d * bins // n for d in draws)
    expected = [
        len(draws) * (math.ceil((b + 1) * n / bins) - math.ceil(b * n / bins)) / n
        for b in range(bins)
    ]
    observed = [counts[b] for b in range(bins)]
    assert stats.chisquare(observed, expected).pvalue > P_MIN


def test_draw_many_decides_on_the_first_word_as_draw_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prob = sampling.rr_probability(Fraction(1), 3)
    lo, hi = prob.first
    assert hi - lo <= 2
    _fixed_bytes(monkeypatch, [0, lo - 1, hi, 2**64 - 1])
    assert prob.draw_many(4).tolist() == [True, True, False, False]


def test_draw_many_refines_an_undecided_word_with_more_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A word inside the bracket is settled as :meth:`draw` settles it (more words)."""
    p = Fraction(1, 3)
    prob = sampling.RealProbability.rational(p)
    lo, hi = prob.first
    assert lo < hi  # 1/3 is not dyadic: the word lo is undecided at 64 bits
    _fixed_bytes(monkeypatch, [lo, 0])
    refined: list[int] = []
    monkeypatch.setattr(
        sampling, "randbelow", lambda n: refined.append(n) or (2**64 - 1 if n == 2**64 else 0)
    )
    drawn = prob.draw_many(2).tolist()
    # U = (lo·2^64 + 2^64 − 1)/2^128 >= 1/3 (lo = floor(2^64/3)... its cell holds 1/3's tail)
    u = Fraction(lo * 2**64 + 2**64 - 1, 2**128)
    assert drawn == [u + Fraction(1, 2**128) <= p, True]
    assert refined == [2**64]


def test_draw_many_frequency_with_every_first_word_undecided() -> None:
    """A bracket that decides nothing at 64 bits: every draw refines, frequency is still p."""
    p = Fraction(2, 7)
    exact = sampling.RealProbability.rational(p)
    wide = sampling.RealProbability(
        lambda bits: (0, 2**bits) if bits == 64 else exact.bracket(bits)
    )
    drawn = wide.draw_many(20_000)
    hits = int(drawn.sum())
    assert stats.binomtest(hits, drawn.size, float(p)).pvalue > P_MIN


@pytest.mark.parametrize("p", [Fraction(1, 2), Fraction(1, 10), Fraction(0), Fraction(1)])
def test_draw_many_frequency(p: Fraction) -> None:
    drawn = sampling.RealProbability.rational(p).draw_many(20_000)
    hits = int(drawn.sum())
    if p in (0, 1):
        assert hits == p * drawn.size
    else:
        assert stats.binomtest(hits, drawn.size, float(p)).pvalue > P_MIN


K = 50
DOMAIN = parse_domain({"attributes": [{"name": "v", "type": "integer", "low": 0, "high": K - 1}]})


@pytest.mark.parametrize(("epsilon", "g"), [(1.0, None), (2.0, 2), (0.5, 7)])
def test_olh_sample_many_fits_the_contract_distribution(epsilon: float, g: int | None) -> None:
    """Pr(bucket = h_seed(v)) = e^ε/(e^ε+g−1), each other bucket 1/(e^ε+g−1); seeds uniform."""
    query = {"mechanism": "olh", "attribute": "v", "epsilon": epsilon}
    if g is not None:
        query["g"] = g
    mech = parse_query(query, DOMAIN)
    n = 30_000
    values = [{"v": i % K} for i in range(n)]
    outputs = mech.sample_many(values)
    assert len(outputs) == n
    g = mech.g  # type: ignore[attr-defined]
    # the bucket's offset from the true value's hash: 0 is "kept", the g−1 others uniform
    offsets = Counter(
        (bucket - olh_hash_value(seed, i % K, g)) % g for i, (seed, bucket) in enumerate(outputs)
    )
    e = math.exp(epsilon)
    expected = [n * e / (e + g - 1)] + [n / (e + g - 1)] * (g - 1)
    assert stats.chisquare([offsets[j] for j in range(g)], expected).pvalue > P_MIN
    # seeds: the top 4 bits uniform over 16 bins, the lowest bit fair
    seeds = np.array([seed for seed, _ in outputs], dtype=np.uint64)
    top = np.bincount((seeds >> np.uint64(60)).astype(np.int64), minlength=16)
    assert stats.chisquare(top).pvalue > P_MIN
    assert stats.binomtest(int((seeds & np.uint64(1)).sum()), n, 0.5).pvalue > P_MIN
    assert all(isinstance(seed, int) and isinstance(b, int) for seed, b in outputs[:10])


def test_olh_sample_many_equals_sample_on_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fed the same words, the batch and the one-by-one sampler give the same outputs."""
    mech = parse_query({"mechanism": "olh", "attribute": "v", "epsilon": 1.0}, DOMAIN)
    lo, hi = mech._keep.first  # type: ignore[attr-defined]
    seeds = [12345, 2**64 - 1, 0, 987654321987654321]
    keeps = [0, 2**64 - 1, lo - 1, hi]  # kept, not kept, kept, not kept
    others = [0, 1 << 62, 2 << 62, 1 << 62]  # g − 1 = 3 others: 2 bits from the top
    values = [{"v": 3}, {"v": 17}, {"v": 0}, {"v": 49}]
    _fixed_bytes(monkeypatch, seeds + keeps + others)
    batch = mech.sample_many(values)
    one_by_one = []
    for i, value in enumerate(values):
        fed = iter([seeds[i], keeps[i], others[i]])
        monkeypatch.setattr(sampling._entropy, "word", lambda fed=fed: next(fed))
        one_by_one.append(mech.sample(value))
    assert batch == one_by_one
    assert [b == olh_hash_value(s, values[i]["v"], 4) for i, (s, b) in enumerate(batch)] == [
        True,
        False,
        True,
        False,
    ]


REGIONS = parse_domain(
    {"attributes": [{"name": "r", "type": "categorical", "values": [f"r{i}" for i in range(6)]}]}
)


@pytest.mark.parametrize(("epsilon", "domain", "name"), [(0.5, DOMAIN, "v"), (2.0, REGIONS, "r")])
def test_grr_sample_many_fits_the_contract_distribution(
    epsilon: float, domain: object, name: str
) -> None:
    """Pr(y = v) = e^ε/(e^ε+k−1), each other value 1/(e^ε+k−1), whatever v (a survey chunk)."""
    mech = parse_query({"mechanism": "grr", "attribute": name, "epsilon": epsilon}, domain)
    attribute = mech.attribute  # type: ignore[attr-defined]
    k = attribute.size
    raw = list(attribute.values) if attribute.values else list(range(k))
    n = 30_000
    values = [{name: raw[i % k]} for i in range(n)]
    outputs = mech.sample_many(values)
    assert len(outputs) == n
    assert all(type(y) is int for y in outputs[:10])
    # each output's offset from the true index: 0 is "kept", the k−1 others uniform
    offsets = Counter((y - i % k) % k for i, y in enumerate(outputs))
    e = math.exp(epsilon)
    expected = [n * e / (e + k - 1)] + [n / (e + k - 1)] * (k - 1)
    assert stats.chisquare([offsets[j] for j in range(k)], expected).pvalue > P_MIN
    assert mech.sample_many([]) == []


def test_grr_sample_many_equals_sample_on_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fed the same words, the batch and the one-by-one sampler give the same outputs."""
    mech = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 1.0}, DOMAIN)
    lo, hi = mech._keep.first  # type: ignore[attr-defined]
    keeps = [0, 2**64 - 1, lo - 1, hi, hi]  # kept, not kept, kept, not kept, not kept
    # K − 1 = 49 others: 6 bits from the top (the first try of the third is rejected: 63 ≥ 49)
    others = [5 << 58, 3 << 58, 63 << 58, 48 << 58, 0]
    values = [{"v": 3}, {"v": 3}, {"v": 0}, {"v": 49}, {"v": 0}]
    tries = [5 << 58, 3 << 58, 63 << 58, 48 << 58, 0, 7 << 58]  # the redraw: 7
    _fixed_bytes(monkeypatch, keeps + tries)
    batch = mech.sample_many(values)
    one_by_one = []
    for i, value in enumerate(values):
        fed = iter([keeps[i], others[i]] if i != 2 else [keeps[i], others[i], 7 << 58])
        monkeypatch.setattr(sampling._entropy, "word", lambda fed=fed: next(fed))
        one_by_one.append(mech.sample(value))
    assert batch == one_by_one == [3, 4, 0, 48, 1]


def test_grr_sample_many_refuses_a_value_outside_the_domain() -> None:
    mech = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 1.0}, DOMAIN)
    with pytest.raises(Exception, match="between"):
        mech.sample_many([{"v": 1}, {"v": K}])
