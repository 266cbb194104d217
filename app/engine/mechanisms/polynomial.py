r"""The query value of ``linear`` and ``logistic``: a polynomial of degree <= 2 in the attributes.

``weights`` names monomials over numeric (``real`` or ``integer``) attributes:

* ``"x"`` — the attribute ``x`` (degree 1);
* ``"x^2"`` — its square;
* ``"x*y"`` — the product of two attributes (``"x*x"`` is ``"x^2"``).

A key that is exactly an attribute's name is that attribute, whatever characters the name has;
otherwise ``^2`` and ``*`` are read as above (spaces around them ignored). A product whose
canonical key (``x^2``, ``x*y`` in attribute order, as :meth:`Polynomial.names` writes it) is
itself an attribute's name is refused: the canonical form would read back as that attribute.
The value is

.. math::

    z(x) = c + \sum_a w_a x_a + \sum_{a \le b} q_{ab}\, x_a x_b,

evaluated in floats by :meth:`Polynomial.evaluate` (the sampler, the range of a finite grid).
The finite-domain table and the continuous bounds compute the same sum in twice the precision,
each monomial split error-free (:func:`~app.engine.numerics.exact_lifted_dot`), with a certified
bound on what is left.

Range over a box (the ``linear`` range check and the tight ε). The extremes of a quadratic over a
box are attained at a point where its gradient restricted to some face vanishes (a vertex is a
0-dimensional face). On the relative interior of a face with free coordinates ``F`` the
stationary points solve ``H_FF x_F = -(w_F + H_F,fixed x_fixed)`` (``H`` the Hessian). If
``H_FF`` is singular, moving along a null vector changes ``z`` linearly, so the extreme over the
face's closure is also attained on its boundary, a smaller face. Enumerating the ``3^k`` faces of
every connected component of the monomials' interaction graph (components add independently)
therefore gives the exact range; components of more than :data:`MAX_EXACT_COMPONENT` attributes
get the sound outer bound of summing each monomial's own range (interval arithmetic). Finite
domains take the range over their grid, exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from app.engine.domain import Domain
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_number, path
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray

#: Largest connected group of attributes whose range is found exactly by enumerating faces.
MAX_EXACT_COMPONENT = 6

#: ``(i, j)`` with ``i <= j``: the monomial ``x_i x_j`` (a square when ``i == j``).
Pair = tuple[int, int]


def _monomial(name: str, domain: Domain) -> tuple[int, ...] | None:
    """The axes a weight key multiplies (one or two), or ``None`` if it names nothing."""
    names = domain.names
    if name in names:
        return (names.index(name),)
    text = name.strip()
    if text.endswith("^2"):
        base = text[:-2].strip()
        if base in names:
            return (names.index(base), names.index(base))
    found: list[tuple[int, int]] = []
    for pos, char in enumerate(text):
        if char == "*":
            left, right = text[:pos].strip(), text[pos + 1 :].strip()
            if left in names and right in names:
                found.append((names.index(left), names.index(right)))
    if len(found) == 1:
        return found[0]
    return None


def _canonical(pair: tuple[int, ...], domain: Domain) -> str:
    """``x^2`` or ``x*y`` (attribute order) for the monomial of axes ``pair``."""
    left, right = domain.attributes[pair[0]].name, domain.attributes[pair[1]].name
    return f"{left}^2" if pair[0] == pair[1] else f"{left}*{right}"


@dataclass(frozen=True)
class Polynomial:
    """``intercept + Σ linear[a] x_a + Σ quadratic[(a, b)] x_a x_b`` over domain axes."""

    linear: tuple[tuple[int, float], ...]
    quadratic: tuple[tuple[Pair, float], ...]
    intercept: float

    @classmethod
    def parse(
        cls, raw: Mapping[str, Any], intercept: float, domain: Domain, field: str
    ) -> Polynomial:
        """Validate a ``weights`` object (see the module docstring); zero weights are dropped."""
        linear: dict[int, float] = {}
        quadratic: dict[Pair, float] = {}
        seen: dict[tuple[int, ...], str] = {}
        for name, w in raw.items():
            w_field = path(field, str(name))
            axes = _monomial(str(name), domain)
            if axes is None:
                raise InvalidInput(
                    w_field,
                    "must name a numeric attribute, its square (name^2) or a product of two "
                    "(name*name)",
                )
            for axis in axes:
                if not domain.attributes[axis].is_numeric:
                    raise InvalidInput(
                        w_field, "must name numeric (integer or real) attributes only"
                    )
            key = tuple(sorted(axes))
            if len(key) == 2 and _canonical(key, domain) in domain.names:
                # the canonical form (to_json, stored histories) would read as that attribute
                raise InvalidInput(w_field, "is ambiguous: an attribute has its canonical name")
            if key in seen:
                raise InvalidInput(w_field, f"names the same term as weights.{seen[key]}")
            seen[key] = str(name)
            weight = as_number(w, w_field)
            if weight == 0.0:
                continue
            if len(key) == 1:
                linear[key[0]] = weight
            else:
                quadratic[(key[0], key[1])] = weight
        return cls(tuple(sorted(linear.items())), tuple(sorted(quadratic.items())), intercept)

    @property
    def axes(self) -> tuple[int, ...]:
        """Every axis the polynomial reads, in order."""
        used = {a for a, _ in self.linear}
        for (i, j), _ in self.quadratic:
            used.update((i, j))
        return tuple(sorted(used))

    def names(self, domain: Domain) -> dict[str, float]:
        """Canonical ``weights``: ``x``, ``x^2``, ``x*y`` (attribute order) to weights."""
        out = {domain.attributes[a].name: w for a, w in self.linear}
        for pair, w in self.quadratic:
            out[_canonical(pair, domain)] = w
        return out

    def evaluate(self, coords: Mapping[int, Any]) -> Any:
        """``z`` at coordinates ``coords[axis]`` (floats or broadcastable arrays).

        Linear monomials first in axis order, then products, each ``w * (x_i * x_j)``: for a
        degree-1 query this is exactly the sum the engine always computed.
        """
        z: Any = self.intercept
        for axis, w in self.linear:
            z = z + w * coords[axis]
        for (i, j), w in self.quadratic:
            z = z + w * (coords[i] * coords[j])
        return z

    def magnitude(self, lo: Mapping[int, float], hi: Mapping[int, float]) -> float:
        """``|c| + Σ |w| max|monomial|`` over the box ``[lo, hi]``: bounds every partial sum."""
        top = {a: max(abs(lo[a]), abs(hi[a])) for a in self.axes}
        total = abs(self.intercept) + sum(abs(w) * top[a] for a, w in self.linear)
        return total + sum(abs(w) * top[i] * top[j] for (i, j), w in self.quadratic)

    def range_over_box(
        self, lo: Mapping[int, float], hi: Mapping[int, float]
    ) -> tuple[float, float]:
        """``(min z, max z)`` over the box (module docstring); degree 1 by the interval sum.

        Degree 2: exact up to rounding, widened by a rounding margin so that the interval
        contains every value :meth:`evaluate` can return in the box.
        """
        if not self.quadratic:
            z_lo = z_hi = self.intercept
            for axis, w in self.linear:
                a, b = w * lo[axis], w * hi[axis]
                z_lo += min(a, b)
                z_hi += max(a, b)
            return z_lo, z_hi
        key = (
            self,
            tuple((a, float(lo[a]), float(hi[a])) for a in self.axes),
        )
        return _quadratic_range(*key)


def _components(poly: Polynomial) -> list[tuple[int, ...]]:
    """Connected components of the axes linked by product monomials."""
    parent = {a: a for a in poly.axes}

    def find(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    for (i, j), _ in poly.quadratic:
        parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for a in poly.axes:
        groups.setdefault(find(a), []).append(a)
    return [tuple(g) for g in groups.values()]


def _face_points(
    axes: tuple[int, ...], lin: FloatArray, hess: FloatArray, lo: FloatArray, hi: FloatArray
) -> FloatArray:
    """Vertices and every face's interior stationary point of one component (rows)."""
    k = len(axes)
    points: list[FloatArray] = []
    for state in itertools.product((0, 1, 2), repeat=k):
        s = np.array(state)
        x = np.where(s == 0, lo, hi).astype(np.float64)
        free = np.flatnonzero(s == 2)
        if free.size:
            fixed = np.flatnonzero(s != 2)
            mat = hess[np.ix_(free, free)]
            rhs = -(lin[free] + hess[np.ix_(free, fixed)] @ x[fixed])
            sol, _, rank, _ = np.linalg.lstsq(mat, rhs, rcond=None)
            if rank < free.size or not np.all(np.isfinite(sol)):
                continue
            if np.any(sol < lo[free]) or np.any(sol > hi[free]):
                continue
            x[free] = sol
        points.append(x)
    return np.array(points)


@lru_cache(maxsize=4096)
def _quadratic_range(
    poly: Polynomial, box: tuple[tuple[int, float, float], ...]
) -> tuple[float, float]:
    lo = {a: low for a, low, _ in box}
    hi = {a: high for a, _, high in box}
    z_lo = z_hi = poly.intercept
    for comp in _components(poly):
        index = {a: n for n, a in enumerate(comp)}
        lin = np.zeros(len(comp))
        hess = np.zeros((len(comp), len(comp)))
        for a, w in poly.linear:
            if a in index:
                lin[index[a]] += w
        for (i, j), w in poly.quadratic:
            if i in index:
                hess[index[i], index[j]] += w
                hess[index[j], index[i]] += w
        c_lo = np.array([lo[a] for a in comp])
        c_hi = np.array([hi[a] for a in comp])
        if len(comp) <= MAX_EXACT_COMPONENT:
            pts = _face_points(comp, lin, hess, c_lo, c_hi)
            values = pts @ lin + 0.5 * np.einsum("ni,ij,nj->n", pts, hess, pts)
            part_lo, part_hi = float(values.min()), float(values.max())
        else:  # interval arithmetic: each monomial's own range, summed (an outer bound)
            part_lo = part_hi = 0.0
            for n in range(len(comp)):
                ends = (lin[n] * c_lo[n], lin[n] * c_hi[n])
                part_lo, part_hi = part_lo + min(ends), part_hi + max(ends)
            for (i, j), w in poly.quadratic:
                if i not in index:
                    continue
                if i == j and lo[i] <= 0.0 <= hi[i]:
                    cands = [0.0, lo[i] * lo[i], hi[i] * hi[i]]
                else:
                    cands = [lo[i] * lo[j], lo[i] * hi[j], hi[i] * lo[j], hi[i] * hi[j]]
                ends = (w * min(cands), w * max(cands))
                part_lo, part_hi = part_lo + min(ends), part_hi + max(ends)
        z_lo += part_lo
        z_hi += part_hi
    pad = 8 * (len(poly.axes) + len(poly.quadratic) + 4) * UNIT_ROUNDOFF * poly.magnitude(lo, hi)
    return z_lo - pad, z_hi + pad
