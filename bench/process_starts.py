"""Which processes test files start: ``strace -f -e trace=execve`` logs, one per file, counted.

Each successful ``execve`` in a log is one process start, sorted into kinds: a
``multiprocessing`` spawn child (a uvicorn worker of ``gatekeeper serve --workers N``, or a
spawned pool of the test process itself), ``gatekeeper serve``, ``gatekeeper worker`` (its
Celery nodes and their pool processes are forked: no ``execve``), any other ``gatekeeper``
command, a ``python -c`` probe, multiprocessing's resource tracker, anything else not Python.
With ``--map`` (the lead's ``GATEKEEPER_TEST_CPU`` file) a last column gives each file's CPU of
reaped children there. Logs are named ``PREFIX<file with / as _>``; making them::

    for f in tests/service/test_cli_service.py tests/service/test_concurrency.py; do
        strace -f --seccomp-bpf -e trace=execve -e signal=none -s 300 \\
            -o /tmp/starts/trace.$(echo $f | tr / _) pytest -q -p no:cacheprovider $f
    done
    python bench/process_starts.py '/tmp/starts/trace.*' --map suite_cpu.jsonl
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re

KINDS = (
    "spawn child",
    "gatekeeper serve",
    "gatekeeper worker",
    "gatekeeper other command",
    "python -c probe",
    "resource tracker",
    "python other",
    "not Python",
)
EXECVE = re.compile(r'\d+\s+execve\("([^"]*)", \[(.*?)\]')
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def kind(argv: list[str]) -> str:
    """The kind of the process ``argv`` starts."""
    line = " ".join(argv)
    if "python" not in argv[0].rsplit("/", 1)[-1] and not argv[0].endswith("gatekeeper"):
        return "not Python"
    if "multiprocessing.spawn import spawn_main" in line:
        return "spawn child"
    if "resource_tracker" in line:
        return "resource tracker"
    command = re.search(r"(?:-m app\.cli|gatekeeper)\s+(\S+)", line)
    if command or argv[0].endswith("gatekeeper"):
        sub = command.group(1) if command else ""
        return {"serve": "gatekeeper serve", "worker": "gatekeeper worker"}.get(
            sub, "gatekeeper other command"
        )
    if len(argv) > 1 and argv[1] == "-c":
        return "python -c probe"
    return "python other"


def starts(path: str) -> collections.Counter[str]:
    """The process starts of one log, by kind (the test runner itself not counted)."""
    found: collections.Counter[str] = collections.Counter()
    first = True
    with open(path) as log:
        for line in log:
            match = EXECVE.match(line.strip())
            if match is None or not line.rstrip().endswith("= 0"):
                continue
            if first:  # pytest itself
                first = False
                continue
            argv = ARG.findall(match.group(2)) or [match.group(1)]
            argv[0] = match.group(1)
            found[kind(argv)] += 1
    return found


def test_file(path: str, prefix: str) -> str:
    """``tests/service/test_x.py`` from a log named ``PREFIXtests_service_test_x.py``."""
    name = path[len(prefix) :]
    parts = name.split("_")
    # directories: the parts before the one that starts the file name (``test``)
    for i, part in enumerate(parts):
        if part == "test":
            return "/".join(parts[:i]) + "/" + "_".join(parts[i:])
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", help="glob of the strace logs, e.g. '/tmp/starts/trace.*'")
    parser.add_argument("--map", help="the suite's CPU map (JSON lines with file and children)")
    args = parser.parse_args()
    prefix = args.logs.rstrip("*")
    rows = {test_file(path, prefix): starts(path) for path in sorted(glob.glob(args.logs))}
    children: collections.Counter[str] = collections.Counter()
    if args.map:
        with open(args.map) as lines:
            for line in lines:
                entry = json.loads(line)
                if "file" in entry:
                    children[entry["file"]] += entry["children"]
    kinds = [k for k in KINDS if any(c[k] for c in rows.values())]
    extra = " children CPU s in the map |" if args.map else ""
    print("| file | " + " | ".join(kinds) + " |" + extra)
    print("|---|" + "---:|" * (len(kinds) + bool(args.map)))
    total: collections.Counter[str] = collections.Counter()
    for name, found in rows.items():
        total.update(found)
        cell = f" {children[name]:.1f} |" if args.map else ""
        print(f"| {name} | " + " | ".join(str(found[k]) for k in kinds) + " |" + cell)
    cell = f" {sum(children[name] for name in rows):.1f} |" if args.map else ""
    print("| **total** | " + " | ".join(str(total[k]) for k in kinds) + " |" + cell)


if __name__ == "__main__":
    main()
