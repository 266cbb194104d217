"""A survey names each new exact state by a per-domain hasher: the same keys (issue 27 item 3)."""

from __future__ import annotations

import random

from app.services.snapshots import canonical_content_key, canonical_content_keys


def test_the_per_domain_content_key_is_the_content_key() -> None:
    rng = random.Random(5)
    for n in range(200):
        domain = '{"attributes":[' + "x" * rng.randrange(400) + f"{n}]}}"
        keyed = canonical_content_keys(domain)
        for _ in range(5):
            canonical = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
            assert keyed(canonical) == canonical_content_key(domain, canonical)
    # a domain's key function never depends on an earlier call's bytes
    keyed = canonical_content_keys("d")
    assert keyed(b"a") == canonical_content_key("d", b"a")
    assert keyed(b"") == canonical_content_key("d", b"")
    assert keyed(b"a") != keyed(b"b")
