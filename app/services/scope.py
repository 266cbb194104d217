"""A project key's scope (issue 25): the labels every object it sees must carry.

Out of scope is not found: the scope's labels are SQL conditions of the one ``SELECT`` that
reads an object by id (no row, as for a missing id: the same answer after the same work — a
missing id's read reads another object's row and labels in its place, ``app.store.objects``
``_TARGET``), of every listing, total and cohort (:func:`app.store.objects.scope_conditions`);
:func:`admits` checks a row read once more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Scope:
    """What a project key may see: the objects carrying every one of ``labels``."""

    project_id: int
    project: str
    labels: tuple[tuple[str, str], ...]

    def admits(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with ``labels`` is in the scope."""
        found = labels or {}
        return all(found.get(name) == value for name, value in self.labels)

    @property
    def label_map(self) -> dict[str, str]:
        """The scope's labels as a mapping."""
        return dict(self.labels)


def admits(scope: Scope | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a caller with ``scope`` (None: unscoped) sees an object with ``labels``."""
    return scope is None or scope.admits(labels)
