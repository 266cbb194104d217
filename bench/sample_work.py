"""A survey chunk's sampling bookkeeping (``survey_runs._sample_groups``), two trees side by side.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/sample_work.py --trees /work/wt/base,. --rounds 6

Issue 27 item 3 (h/member). ``bench/group_work.py`` replaces the sampling by fixed draws; this
one runs ``_sample_groups`` itself on chunks of ``--members`` members in ``--groups`` decision
groups per chunk (0: a group per member, the seventh diverging survey's chunk; the members
spread over the groups at random, the groups in order of their first member, as
``_decide_rows`` builds them): each member's value encrypted with one key (the values of
``survey_load.py``'s population: age, sex, region) and decrypted by the real cipher
(``ValueCipher.decrypt_many``). The draws are the only part replaced: a ``grr`` query on
``region`` whose ``sample_many`` returns seeded pseudo-random outputs (the same in both trees,
so the grouping of the outputs can be compared; the real sampler is called the same way, with
the same values, in every tree). For every round and tree (the order alternating by round) a
child process with that tree first on ``PYTHONPATH`` runs ``--chunks`` chunks and prints its
thread CPU seconds in ``_sample_groups`` and a digest of what it returned (each group's outputs
in order, each output's members in order): the trees must print the same digest.
"""

from __future__ import annotations

import argparse

from group_work import POPULATION, run_trees  # type: ignore[import-not-found]

CHILD = (
    r"""
import hashlib, json, random, sys, time

from app import crypto
from app.engine.mechanisms import parse_query
from app.services import survey_runs
from app.services.survey_groups import GroupAccepted
from app.store.surveys import GroupKey, MemberRow

members, groups, chunks, seed = (int(a) for a in sys.argv[1:5])
"""
    + POPULATION
    + r"""
real = parse_query({"mechanism": "grr", "attribute": "region", "epsilon": 0.5}, domain, "q",
                   limits=limits)
draws = random.Random(seed + 1)


class Drawn:
    # the query's sampler, its draws seeded: only sample_many is read by _sample_groups
    def sample_many(self, values):
        return [(real.attribute.index_of(v["region"], "region") + draws.randrange(3)) % 15
                for v in values]


cipher = crypto.ValueCipher([crypto.new_key().encode()])
sealed = [
    cipher.encrypt(json.dumps({"age": a, "sex": s, "region": f"r{r}"}))
    for a in range(10) for s in range(2) for r in range(15)
]
group = GroupAccepted(Drawn(), None, None)
work = []
for chunk in range(chunks):
    rows = []
    for m in range(members):
        key = GroupKey(domain_text, 4.0, "bayesian", "3", f"h{chunk}.{m}", "s", 0, 0.1, 0.1,
                       None, "0", None, None, 0.0, 0.0)
        rows.append(MemberRow(f"o{chunk}.{m:05d}", 7, 6, 0, False, rng.choice(sealed), key))
    by_group = {}
    for row in rows:
        n = len(by_group) if not groups else rng.randrange(groups)
        by_group.setdefault(n, []).append(row)
    accepted = [
        survey_runs._Sampling(found[0].key, group, found, None) for found in by_group.values()
    ]
    work.append((accepted, rows))
spent = 0.0
digest = hashlib.sha256()
for accepted, rows in work:
    start = time.thread_time()
    sampled = survey_runs._sample_groups(accepted, cipher, rows)
    spent += time.thread_time() - start
    for by_output in sampled:
        digest.update(repr([(y, [r.id for r in rs]) for y, rs in by_output.items()]).encode())
print(f"{spent:.4f} {digest.hexdigest()[:16]}")
"""
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", required=True, help="comma-separated worktrees (first: base)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--members", type=int, default=5000, help="members per chunk")
    parser.add_argument("--groups", type=int, default=0, help="groups per chunk (0: one each)")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    run_trees(CHILD, [args.members, args.groups, args.chunks, args.seed], args.trees, args.rounds)


if __name__ == "__main__":
    main()
