r"""Frequency oracles for large domains: ``olh`` (optimized local hashing) and ``hadamard``.

Both are randomized responses over a *partition* of the attribute's ``k`` values into the values
an output supports and the rest, so one output's log-likelihood is two-level,
``C + ε·[v ∈ S_y]``, and the Bayesian filter charges them exactly (:mod:`app.engine.exact`: an
:class:`~app.engine.exact.ExactTerm` with a 0/1 coefficient per value, O(k) per report, no
``k × g`` table).

``olh`` (Wang, Blocki, Li and Jha, USENIX Security 2017): the gatekeeper draws a public 64-bit
``seed`` from the CSPRNG, hashes the true value's index ``i`` to ``h_seed(i) ∈ [0, g)`` and
reports that bucket with probability ``e^ε/(e^ε+g−1)``, each other bucket with
``1/(e^ε+g−1)``. ``S_y`` = the values hashed to the reported bucket. The hash is the one
contract.md fixes so that every client can recompute it (:func:`olh_hash`): SplitMix64 from
``state = seed`` gives ``a = (first mod (p−1)) + 1`` and ``b = second mod p``, ``p = 2^61 − 1``,
and ``h_seed(i) = ((a·i + b) mod p) mod g``.

``hadamard`` (Hadamard response; Acharya, Sun and Zhang 2019): ``K`` is the smallest power of 2
above ``k``; value ``i`` owns row ``i + 1`` of the Sylvester matrix ``H[r, c] =
(−1)^popcount(r & c)`` (row 0 is all +1 and is skipped), and column ``j`` is reported with
probability ``2e^ε/(K(1+e^ε))`` where ``H[i+1, j] = +1`` and ``2/(K(1+e^ε))`` elsewhere (each
row but the first has ``K/2`` entries of each sign). ``S_j`` = the values whose row is +1 at
``j``.

Worst case without enumerating outputs. By :func:`~app.engine.mechanisms.base.subset_worst` the
worst loss over *every* subset ``S`` is attained by any ``S`` that holds one value ``v`` and not
another ``w`` (a pair it returns). Every ordered pair is separated by some output, so this bound
is the worst case of the mechanism itself, not just an upper bound of it:

* ``hadamard``: rows ``r = v+1`` and ``s = w+1`` are distinct non-zero vectors over GF(2), hence
  linearly independent, so ``c ↦ (popcount(r&c), popcount(s&c)) mod 2`` is onto; a column with
  parities (0, 1) is built directly (:func:`separating_column`);
* ``olh``: for fixed ``i ≠ j`` the seeds with ``h(i) ≠ h(j)`` are all but about ``1/g`` of them;
  :func:`separating_seed` finds the first one (seed 0, 1, 2, …; a couple of tries).

The dry-run lists that witness output and says the list is not complete; the worst case (and,
for RR-family histories, the exact loss) is then the worst over all ``2^64·g`` or ``K`` outputs.

Exact sampling: the seed and the "other" buckets/columns are uniform integers
(:func:`~app.engine.sampling.randbelow`), and the keep/flip choice draws
``e^ε/(g−1+e^ε)`` (olh) or ``e^ε/(1+e^ε)`` (hadamard) of the written ε exactly
(:func:`~app.engine.sampling.rr_probability`), so every output's likelihood ratio is exactly
``e^ε``, the ratio the exact loss charges.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine import sampling
from app.engine.domain import Attribute, Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.exact import (
    ExactLoss,
    ExactQuery,
    ExactTerm,
    Group,
    subset_losses,
    subset_profiles,
)
from app.engine.jsonfields import as_integer, as_object, check_keys, path
from app.engine.likelihood import LikelihoodState, Term, TermRows
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import (
    CandidateLosses,
    Mechanism,
    Output,
    check_epsilon,
    finite_attribute,
    output_index,
    rr_log_probs,
    subset_worst,
)
from app.engine.numerics import decimal_fraction, written_epsilon_error
from app.engine.sampling import RealProbability, rr_probability

#: The Mersenne prime of the olh hash.
HASH_PRIME = (1 << 61) - 1
_MASK64 = (1 << 64) - 1
#: Values an olh hash can index in uint64 arithmetic (:func:`olh_hash`): ``i < 2^24``.
MAX_HASHED_VALUES = 1 << 24
#: Largest ``k`` of a ``hadamard`` query (``K <= 2^21`` columns).
MAX_HADAMARD_VALUES = 1 << 20
_SEED = re.compile(r"[0-9]{1,20}")
U64 = npt.NDArray[np.uint64]


def splitmix64(state: int) -> tuple[int, int]:
    """The first two outputs of SplitMix64 started at ``state`` (contract.md's recipe).

    >>> [hex(z) for z in splitmix64(0)]
    ['0xe220a8397b1dcdaf', '0x6e789e6aa1b965f4']
    """
    out = []
    for _ in range(2):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append(z ^ (z >> 31))
    return out[0], out[1]


def hash_coefficients_array(seeds: U64) -> tuple[U64, U64]:
    """:func:`hash_coefficients` of every seed, vectorised.

    uint64 arithmetic wraps modulo 2^64, as :func:`splitmix64` does.
    """
    golden = np.uint64(0x9E3779B97F4A7C15)
    out = []
    state = np.asarray(seeds, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for _ in range(2):
            state = state + golden
            z = state
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            out.append(z ^ (z >> np.uint64(31)))
    return out[0] % np.uint64(HASH_PRIME - 1) + np.uint64(1), out[1] % np.uint64(HASH_PRIME)


def hash_coefficients(seed: int) -> tuple[int, int]:
    """``(a, b)`` of ``h_seed``: ``a ∈ [1, p−1]``, ``b ∈ [0, p−1]``."""
    first, second = splitmix64(seed)
    return first % (HASH_PRIME - 1) + 1, second % HASH_PRIME


def olh_hash_value(seed: int, index: int, g: int) -> int:
    """``h_seed(index)`` in Python integers: the reference :func:`olh_hash` is tested against.

    >>> olh_hash_value(0, 0, 3), olh_hash_value(0, 1, 3), olh_hash_value(12345, 7, 5)
    (0, 2, 0)
    """
    a, b = hash_coefficients(seed)
    return ((a * index + b) % HASH_PRIME) % g


def _mod_prime(x: U64) -> U64:
    """``x mod (2^61 − 1)`` for ``x < 2^63`` (uint64, vectorised)."""
    x = (x & np.uint64(HASH_PRIME)) + (x >> np.uint64(61))
    return np.where(x >= np.uint64(HASH_PRIME), x - np.uint64(HASH_PRIME), x)


def olh_hash(a: U64 | np.uint64, b: U64 | np.uint64, indexes: U64, g: int) -> U64:
    """``((a·i + b) mod p) mod g`` elementwise (broadcasting), exactly, in uint64.

    ``a, b < p`` and ``i < 2^24``: with ``a = a_hi·2^32 + a_lo``, ``a_lo·i < 2^56`` and
    ``a_hi·i < 2^53``; ``2^61 ≡ 1 (mod p)`` folds ``(a_hi·i)·2^32`` to
    ``(low 29 bits)·2^32 + (the rest)``, both below ``2^61``, so the sum stays below ``2^63``.

    >>> import numpy as np
    >>> a, b = (np.array([x], dtype=np.uint64) for x in hash_coefficients(12345))
    >>> olh_hash(a, b, np.arange(8, dtype=np.uint64), 5).tolist()
    [1, 1, 1, 1, 1, 1, 0, 0]
    """
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    i = np.asarray(indexes, dtype=np.uint64)
    high = (a >> np.uint64(32)) * i
    folded = ((high & np.uint64((1 << 29) - 1)) << np.uint64(32)) + (high >> np.uint64(29))
    total = _mod_prime(folded + (a & np.uint64(_MASK64 >> 32)) * i)
    total = _mod_prime(total + b)
    return total % np.uint64(g)


def olh_hashes(seed: int, k: int, g: int) -> npt.NDArray[np.int64]:
    """``h_seed(i)`` for every value index ``i < k``."""
    a, b = hash_coefficients(seed)
    values = olh_hash(np.uint64(a), np.uint64(b), np.arange(k, dtype=np.uint64), g)
    return values.astype(np.int64)


def default_g(epsilon: float, k: int) -> int:
    """``round(e^ε) + 1`` (Wang et al.'s optimum), within the allowed ``[2, max(2, k)]``."""
    best = round(math.exp(min(epsilon, 700.0))) + 1
    return max(2, min(best, max(2, k)))


def separating_seed(inside: int, outside: int, g: int) -> int:
    """The first seed whose hash puts ``inside`` and ``outside`` in different buckets."""
    seed = 0
    while olh_hash_value(seed, inside, g) == olh_hash_value(seed, outside, g):
        seed += 1
    return seed


def parity(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``popcount(x) mod 2`` elementwise for ``0 <= x < 2^32``."""
    x = np.asarray(values, dtype=np.int64)
    for shift in (16, 8, 4, 2, 1):
        x = x ^ (x >> shift)
    return x & 1


def hadamard_sign(row: int, column: int) -> int:
    """``H[row, column] = (−1)^popcount(row & column)`` (Sylvester).

    >>> [hadamard_sign(3, c) for c in range(4)]
    [1, -1, -1, 1]
    """
    return -1 if (row & column).bit_count() % 2 else 1


def separating_column(inside: int, outside: int) -> int:
    """A column ``c`` with ``H[inside+1, c] = +1`` and ``H[outside+1, c] = −1``, inside ≠ outside.

    A bit of ``s = outside+1`` absent from ``r = inside+1`` gives parities (0, 1) alone; if ``s``'s
    bits all lie in ``r``, a bit ``d`` of ``s`` plus a bit ``c`` of ``r`` outside ``s`` does.

    >>> c = separating_column(4, 1)
    >>> hadamard_sign(5, c), hadamard_sign(2, c)
    (1, -1)
    """
    r, s = inside + 1, outside + 1
    only_s = s & ~r
    if only_s:
        return only_s & -only_s
    only_r = r & ~s
    return (only_r & -only_r) | (s & -s)


#: Hashes computed per block by :meth:`OptimizedLocalHashing.hits_many`.
_HASH_BLOCK = 1 << 15


class _TwoLevel(Mechanism):
    """A finite attribute, a written ε, and outputs that each add ε on a subset of its values."""

    attribute: Attribute

    def _bind(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> str:
        attr_field = path(field, "attribute")
        self.axis, self.attribute = finite_attribute(raw, domain, field)
        self.k = self.attribute.size
        self.eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.max_listed = limits.max_listed_outputs
        return attr_field

    def hits(self, output: Output) -> npt.NDArray[np.int64]:
        """``[v ∈ S_output]`` for every value ``v`` (0/1)."""
        raise NotImplementedError

    @property
    def _levels(self) -> tuple[float, float]:
        """``log Pr`` on the supported values and elsewhere, constants that cancel dropped."""
        raise NotImplementedError

    @property
    def _group(self) -> Group:
        return Group(decimal_fraction(self.eps))

    def term(self, output: Output) -> Term:
        """The higher level on ``S_output``, the lower elsewhere (one hash of the k values)."""
        hit, miss = self._levels
        hits = self.hits(output)
        values = np.where(hits == 1, hit, miss).astype(np.float64)
        error = written_epsilon_error(max(abs(hit), abs(miss)))
        return Term((self.axis,), values, error, exact=ExactTerm(self.axis, self._group, hits))

    def hits_many(self, outputs: Sequence[Output]) -> npt.NDArray[np.int64]:
        """:meth:`hits` of every output, one row each."""
        return np.stack([self.hits(output) for output in outputs])

    def terms_many(self, outputs: Sequence[Output]) -> TermRows:
        """:meth:`term` of every output at once (the hits of all of them: :meth:`hits_many`)."""
        hit, miss = self._levels
        hits = self.hits_many(outputs)
        values = np.where(hits == 1, np.float64(hit), np.float64(miss))
        magnitudes = np.abs(values).max(axis=1, initial=0.0)
        extra = np.full(len(outputs), written_epsilon_error(max(abs(hit), abs(miss))))
        return TermRows((self.axis,), values, magnitudes, extra, self.axis, self._group, hits)

    def exact_term(self, output: Output) -> ExactTerm:
        """``ε`` on ``S_output`` (the ratio of the two levels is exactly ``e^ε``)."""
        return ExactTerm(self.axis, self._group, self.hits(output))

    def exact_query(self) -> ExactQuery:
        """The worst output only (:meth:`candidate_losses` lists one witness)."""
        return ExactQuery(self.axis, self._group, "ue", enumerate=False)

    def witness(self, inside: int | None, outside: int | None) -> Output:
        """An output whose subset holds ``inside`` and not ``outside`` (any output for None)."""
        raise NotImplementedError

    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        """The worst output, without enumerating outputs (module docstring), as one witness."""
        maxima, minima = state.extremes_over((self.axis,))
        hit, miss = self._levels
        found = subset_worst(maxima, minima, hit - miss)
        output = self.witness(found.inside, found.outside)
        magnitude = max(abs(hit), abs(miss))
        return CandidateLosses(
            np.array([found.loss]),
            lambda _j: self.output_json(output),
            magnitude,
            written_epsilon_error(magnitude),
            complete=False,
        )


class OptimizedLocalHashing(_TwoLevel):
    """``olh``: hash to ``g`` buckets with a public CSPRNG seed, then ``g``-ary RR."""

    kind = "olh"
    distinct_outputs = True

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(raw, field, required=("mechanism", "attribute", "epsilon"), optional=("g",))
        attr_field = self._bind(raw, domain, field, limits)
        if self.k > MAX_HASHED_VALUES:
            raise InvalidInput(attr_field, f"has more than {MAX_HASHED_VALUES} values to hash")
        top = max(2, self.k)
        if "g" in raw:
            g = as_integer(raw["g"], path(field, "g"))
            if not 2 <= g <= top:
                raise InvalidInput(
                    path(field, "g"), f"must be between 2 and max(2, k) = {top} for this attribute"
                )
        else:
            g = default_g(self.eps, self.k)
        self.g = g
        super().__init__(domain, self.eps, self.eps if self.k > 1 else 0.0, field)

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON (``g`` resolved)."""
        return {
            "mechanism": self.kind,
            "attribute": self.attribute.name,
            "epsilon": self.eps,
            "g": self.g,
        }

    @property
    def output_count(self) -> int:
        """``2^64`` seeds times ``g`` buckets."""
        return (1 << 64) * self.g

    def parse_output(self, raw: Any, field: str) -> Output:
        """``{"seed": "<decimal digits, < 2^64>", "bucket": <integer in [0, g)>}``."""
        obj = as_object(raw, field)
        check_keys(obj, field, required=("seed", "bucket"))
        seed_raw = obj["seed"]
        seed_field = path(field, "seed")
        if not isinstance(seed_raw, str) or not _SEED.fullmatch(seed_raw):
            raise InvalidInput(seed_field, "must be a string of decimal digits")
        seed = int(seed_raw)
        if seed > _MASK64:
            raise InvalidInput(seed_field, "must be below 2^64")
        bucket = as_integer(obj["bucket"], path(field, "bucket"))
        if not 0 <= bucket < self.g:
            raise InvalidInput(path(field, "bucket"), f"must be between 0 and {self.g - 1}")
        return (seed, bucket)

    def output_json(self, output: Output) -> Any:
        """``{"seed": "...", "bucket": b}`` (the seed as a decimal string: exact in any JSON)."""
        seed, bucket = _pair(output)
        return {"seed": str(seed), "bucket": bucket}

    def output_text(self, output: Output) -> str:
        """``json.dumps`` of :meth:`output_json`, written directly (a survey writes one a member).

        >>> from app.engine.domain import parse_domain
        >>> domain = parse_domain({"attributes": [{"name": "v", "type": "integer", "low": 0,
        ...                                        "high": 9}]})
        >>> from app.engine.mechanisms import parse_query
        >>> parse_query({"mechanism": "olh", "attribute": "v", "epsilon": 1}, domain).output_text(
        ...     (2**64 - 1, 3))
        '{"seed": "18446744073709551615", "bucket": 3}'
        """
        seed, bucket = _pair(output)
        return f'{{"seed": "{int(seed)}", "bucket": {int(bucket)}}}'

    def listed_output(self, j: int) -> Output:
        """Seed ``j // g``, bucket ``j mod g``."""
        return (j // self.g, j % self.g)

    @property
    def _levels(self) -> tuple[float, float]:
        return rr_log_probs(self.eps, self.g)

    def hits(self, output: Output) -> npt.NDArray[np.int64]:
        """``[h_seed(v) = bucket]`` per value (one vectorised hash of the k indexes)."""
        seed, bucket = _pair(output)
        hit: npt.NDArray[np.int64] = (olh_hashes(seed, self.k, self.g) == bucket).astype(np.int64)
        return hit

    def hits_many(self, outputs: Sequence[Output]) -> npt.NDArray[np.int64]:
        """:meth:`hits` of every output: all seeds' hashes of the k values in one pass."""
        pairs = [_pair(output) for output in outputs]
        seeds = np.array([seed for seed, _ in pairs], dtype=np.uint64)
        buckets = np.array([bucket for _, bucket in pairs], dtype=np.uint64)
        a, b = hash_coefficients_array(seeds)
        indexes = np.arange(self.k, dtype=np.uint64)
        found = np.empty((len(pairs), self.k), dtype=np.int64)
        rows = max(1, _HASH_BLOCK // max(1, self.k))  # temporaries that stay in cache
        for start in range(0, len(pairs), rows):
            part = slice(start, start + rows)
            hashed = olh_hash(a[part, None], b[part, None], indexes, self.g)
            found[part] = hashed == buckets[part, None]
        return found

    def exact_losses_after(
        self, histories: Sequence[ExactLoss], outputs: Sequence[Output], owners: Sequence[int]
    ) -> list[Fraction] | None:
        """Every report's exact loss at once (:func:`~app.engine.exact.subset_losses`).

        All seeds' hash coefficients in one vectorised pass; each report's subset is looked up
        only at the few values that decide the extremes of its history.
        """
        profiles = []
        for profile in subset_profiles(histories, self.axis, self._group):
            if profile is None:
                return None
            profiles.append(profile)
        pairs = [_pair(output) for output in outputs]
        seeds = np.array([seed for seed, _ in pairs], dtype=np.uint64)
        buckets = np.array([bucket for _, bucket in pairs], dtype=np.uint64)
        a, b = hash_coefficients_array(seeds)

        def hits(rows: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> Any:
            indexes = np.asarray(values, dtype=np.uint64)
            hashed = olh_hash(a[rows, None], b[rows, None], indexes, self.g)
            return hashed == buckets[rows, None]

        # each probed value is in a report's subset with probability about 1/g: 8·g values
        # hold a member but with probability (1 − 1/g)^(8g) < e^-8 (that report is then
        # looked at over all k values, exactly), and hashing 8·g values instead of 64 halves
        # a chunk's pass at the default g = 4 (80 → 38 ms for 5,000 reports, k = 1,000)
        probe = min(self.k, max(16, 8 * self.g))
        return subset_losses(profiles, np.asarray(owners, dtype=np.int64), hits, probe)

    def witness(self, inside: int | None, outside: int | None) -> Output:
        """The first seed separating the pair, and ``inside``'s bucket under it."""
        if inside is None or outside is None:
            return (0, 0)
        seed = separating_seed(inside, outside, self.g)
        return (seed, olh_hash_value(seed, inside, self.g))

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """A fresh seed; the true value's bucket with ``e^ε/(e^ε+g−1)``, else a uniform other."""
        v = self.attribute.index_of(value[self.attribute.name], self.attribute.name)
        seed = sampling.randbelow(1 << 64)
        own = olh_hash_value(seed, v, self.g)
        keep = self._keep.draw()
        other = sampling.randbelow(self.g - 1)
        other += other >= own
        return (seed, own if keep else other)

    def sample_many(self, values: Sequence[Mapping[str, Scalar]]) -> list[Output]:
        """:meth:`sample` for every value at once, with the same exact distribution.

        :meth:`sample` draws, per value, a seed (one uniform 64-bit word), the keep event
        (:class:`~app.engine.sampling.RealProbability`) and a uniform other bucket in
        ``[0, g−1)``, each independent of the others and of the value. Here the seeds are the
        words of one :func:`~app.engine.sampling.words` call (uniform on ``[0, 2^64)``, as
        ``randbelow(2^64)``), the keep events one
        :meth:`~app.engine.sampling.RealProbability.draw_many` and the other buckets one
        :func:`~app.engine.sampling.randbelow_array` (exact rejection sampling), all
        independent; ``h_seed(v)`` is :func:`olh_hash` (uint64, exact: equal to
        :func:`olh_hash_value`). So each ``(seed, bucket)`` has :meth:`sample`'s distribution
        and the outputs are independent; the work does not depend on the values.
        """
        count = len(values)
        if not count:
            return []
        name = self.attribute.name
        indexes = np.array(
            self.attribute.indexes_of([value[name] for value in values], name), dtype=np.uint64
        )
        seeds = sampling.words(count)
        a, b = hash_coefficients_array(seeds)
        own = olh_hash(a, b, indexes, self.g)
        keep = self._keep.draw_many(count)
        other = sampling.randbelow_array(self.g - 1, count)
        other += (other >= own).astype(np.uint64)
        buckets = np.where(keep, own, other)
        return list(zip(seeds.tolist(), buckets.tolist(), strict=True))

    @cached_property
    def _keep(self) -> RealProbability:
        """``e^ε/(g−1+e^ε)`` for the written ε, bracketed once."""
        return rr_probability(decimal_fraction(self.eps), self.g - 1)


class HadamardResponse(_TwoLevel):
    """``hadamard``: a column of the ``K × K`` Sylvester matrix.

    The column is +1 at the true value's row with probability ``e^ε/(1+e^ε)``.
    """

    kind = "hadamard"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(raw, field, required=("mechanism", "attribute", "epsilon"))
        attr_field = self._bind(raw, domain, field, limits)
        if self.k > MAX_HADAMARD_VALUES:
            raise InvalidInput(
                attr_field, f"has more than {MAX_HADAMARD_VALUES} values (the hadamard limit)"
            )
        #: Columns: the smallest power of 2 above k.
        self.columns = 1 << self.k.bit_length()
        super().__init__(domain, self.eps, self.eps if self.k > 1 else 0.0, field)

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {"mechanism": self.kind, "attribute": self.attribute.name, "epsilon": self.eps}

    @property
    def output_count(self) -> int:
        """``K`` columns."""
        return self.columns

    def parse_output(self, raw: Any, field: str) -> Output:
        """An integer column in ``[0, K)``."""
        column = as_integer(raw, field)
        if not 0 <= column < self.columns:
            raise InvalidInput(field, f"must be between 0 and {self.columns - 1}")
        return column

    def output_json(self, output: Output) -> Any:
        """The column."""
        return int(output)  # type: ignore[arg-type]

    @property
    def _levels(self) -> tuple[float, float]:
        return rr_log_probs(self.eps, 2)

    def hits(self, output: Output) -> npt.NDArray[np.int64]:
        """``[H[v+1, column] = +1]`` per value."""
        rows = np.arange(1, self.k + 1, dtype=np.int64)
        return 1 - parity(rows & output_index(output))

    @cached_property
    def _table(self) -> npt.NDArray[np.int64]:
        """``hits`` of every column (``k × K``; only built when K is within the listing limit)."""
        rows = np.arange(1, self.k + 1, dtype=np.int64)[:, None]
        return 1 - parity(rows & np.arange(self.columns, dtype=np.int64)[None, :])

    def exact_query(self) -> ExactQuery:
        """Every column when they are listed, else the worst one."""
        if self.columns <= self.max_listed:
            return ExactQuery(self.axis, self._group, "table", self._table)
        return super().exact_query()

    def witness(self, inside: int | None, outside: int | None) -> Output:
        """A column separating the pair (:func:`separating_column`)."""
        if inside is None or outside is None:
            return 0
        return separating_column(inside, outside)

    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        """Every column when ``K`` is within the listing limit, else the worst one."""
        if self.columns > self.max_listed:
            return super().candidate_losses(state)
        maxima, minima = state.extremes_over((self.axis,))
        hit, miss = self._levels
        shifts = np.where(self._table == 1, hit, miss)
        losses = (maxima[:, None] + shifts).max(axis=0) - (minima[:, None] + shifts).min(axis=0)
        magnitude = max(abs(hit), abs(miss))
        return CandidateLosses(
            np.asarray(losses, dtype=np.float64),
            self.output_json,
            magnitude,
            written_epsilon_error(magnitude),
        )

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Keep (+1 side) with ``e^ε/(1+e^ε)``; a uniform column of the chosen side.

        Row ``r = v+1`` has a lowest set bit ``t``: the ``K/2`` draws of the other bits, each
        completed by the one value of bit ``t`` that gives the wanted parity, are the ``K/2``
        columns of that sign, uniformly.
        """
        v = self.attribute.index_of(value[self.attribute.name], self.attribute.name)
        row = v + 1
        keep = self._keep.draw()
        low = row & -row
        t = low.bit_length() - 1
        rest = sampling.randbelow(self.columns // 2)
        column = ((rest >> t) << (t + 1)) | (rest & (low - 1))
        if ((row & column).bit_count() % 2 == 0) != keep:
            column |= low
        return column

    @cached_property
    def _keep(self) -> RealProbability:
        """``e^ε/(1+e^ε)`` for the written ε, bracketed once."""
        return rr_probability(decimal_fraction(self.eps), 1)


def _pair(output: Output) -> tuple[int, int]:
    if not isinstance(output, tuple) or len(output) != 2:
        raise TypeError("an olh output is a (seed, bucket) pair")
    return output[0], output[1]
