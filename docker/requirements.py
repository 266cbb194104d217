"""Print the runtime dependencies of pyproject.toml, one per line (for a cached image layer).

The Dockerfile installs these before it copies the source, so a code change does not reinstall
numpy, scipy and the rest: ``python requirements.py > requirements.txt``.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def main() -> None:
    """Write ``[project].dependencies`` of the pyproject.toml beside (or in the cwd) to stdout."""
    here = Path(__file__).resolve().parent
    for candidate in (Path.cwd() / "pyproject.toml", here.parent / "pyproject.toml"):
        if candidate.exists():
            project = tomllib.loads(candidate.read_text())["project"]
            sys.stdout.write("".join(f"{dep}\n" for dep in project["dependencies"]))
            return
    raise SystemExit("pyproject.toml not found")


if __name__ == "__main__":
    main()
