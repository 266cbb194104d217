"""What a process imports at start-up: no SciPy, HiGHS, threadpoolctl or Alembic (issue 27 item 5).

Every ``gatekeeper`` command, server worker and Celery worker imports ``app.cli`` or
``app.bootstrap`` and the app; the suite starts hundreds of them. SciPy (``scipy.special``,
``scipy.optimize``: about 0.35 s of CPU), ``highspy`` (its extension: about 7 ms),
``threadpoolctl`` (about 3 ms) and Alembic with Mako and Pygments (about 0.25 s) are imported
where they are used (:func:`app.engine.numerics.expit`, the SciPy LP and L-BFGS-B calls, the
first HiGHS LP of :mod:`app.engine.continuous.highs`,
:func:`app.worker.threads.single_threaded_blas` when no BLAS thread variable is set,
:func:`app.bootstrap.prepare_database`; a command's migration check reads the scripts' text,
:func:`app.db.migrate.read_lineage`), so a process that never evaluates a logistic, solves
an LP, limits BLAS's threads or migrates does not pay for them. This keeps a new module-level
import from bringing them back unnoticed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "highspy", "threadpoolctl", "alembic", "mako", "pygments")


def _loaded_after(statement: str, where: str = f"m.split('.')[0] in {HEAVY!r}") -> list[str]:
    """The modules ``m`` loaded after ``statement`` (in a new interpreter) for which ``where``."""
    probe = (
        f"{statement}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if {where})))"
    )
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_command_and_a_server_worker_start_without_scipy_highspy_or_alembic() -> None:
    assert _loaded_after("import app.cli") == []
    # what a uvicorn worker imports: the factory's module and the web application
    assert _loaded_after("import app.bootstrap, app.api.main") == []
    # what a Celery worker node imports (`gatekeeper worker`)
    assert _loaded_after("import app.node, app.worker.celery_app") == []


def test_the_probe_sees_them_when_they_are_used() -> None:
    # the check above can fail: the same probe reports the modules once they are used
    loaded = _loaded_after(
        "from app.engine.numerics import expit\nexpit(0.0)\n"
        "from app.db.migrate import alembic_lineage\nalembic_lineage()\n"
        "import numpy as np\nfrom app.engine.continuous import highs\n"
        "one = np.ones(1)\nhighs.solve(one, np.ones((1, 1)), one, 0 * one, one)\n"
        "import os\nfrom app.worker.threads import BLAS_THREAD_VARIABLES, single_threaded_blas\n"
        "for name in BLAS_THREAD_VARIABLES: os.environ.pop(name, None)\n"
        "assert single_threaded_blas()"
    )
    assert "scipy.special" in loaded
    assert "highspy" in loaded
    assert "threadpoolctl" in loaded
    assert "alembic" in loaded


def test_the_command_line_parser_starts_without_the_engine_or_numpy() -> None:
    # `gatekeeper --help` and a mistyped command need only the parser: the engine (with NumPy,
    # ~0.1 s of CPU) is imported by the commands that use it (`loss`: app.cli.cmd_loss)
    where = "m.split('.')[0] == 'numpy' or m == 'app.engine.calculator'"
    assert _loaded_after("import app.cli", where) == []


def test_help_exits_in_the_parser_without_numpy_or_pydantic() -> None:
    # app.cli.main imports the settings' and the cipher's errors after the parse: `--help` and a
    # mistyped command exit inside argparse (NumPy, pydantic, pydantic-settings: ~0.2 s)
    where = "m.split('.')[0] in ('numpy', 'pydantic', 'pydantic_settings', 'cryptography')"
    for argv in (["--help"], ["no-such-command"]):
        statement = f"from app.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    0"
        assert _loaded_after(statement, where) == []
    # the probe sees them once a command runs past the parse
    assert {"pydantic_settings", "cryptography"} <= set(
        _loaded_after("from app.cli import main\nmain(['encryption', 'new-key'])", where)
    )


def test_the_serve_parents_prestart_folds_import_neither_the_services_nor_numpy(
    tmp_path: Path,
) -> None:
    # `gatekeeper serve` (and `migrate`, `states collect`) fold object_counts and collect unnamed
    # states through the store: the services' modules would bring the engine, the schemas and
    # the ORM models (~0.13 s) into a parent that never serves
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", f"from app.db.migrate import upgrade; upgrade({url!r})"],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=True,
    )
    # nor NumPy: app.crypto (which app.settings imports) imports it for its batch decryption
    where = (
        "m in ('app.services.objects', 'app.services.snapshots', 'app.engine.pipeline', 'numpy')"
    )
    folds = (
        "import app.settings, app.crypto\n"
        "from app.cli import _collect_states, _fold_object_counts\n"
        "from app.db.session import make_engine\n"
        f"engine = make_engine({url!r})\n"
        "_fold_object_counts(engine)\nassert _collect_states(engine) == 0"
    )
    assert _loaded_after(folds, where) == []
    # and the probe sees them where the service is used
    assert {"app.services.snapshots", "numpy"} <= set(
        _loaded_after(
            folds + "\nfrom app.services.snapshots import collect_states\ncollect_states(engine)",
            where,
        )
    )
