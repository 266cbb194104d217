"""Hooks for the schemathesis command line (``SCHEMATHESIS_HOOKS``): spare the run's own key.

``DELETE /v1/keys/{key_id}`` is never generated with the run's key id, so a run cannot revoke
the key it is authenticated with (tests/service/test_schemathesis_cli.py).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis


@schemathesis.hook
def filter_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> bool:
    """False for the run's own key id (``GATEKEEPER_RUN_KEY_ID``)."""
    own = int(os.environ.get("GATEKEEPER_RUN_KEY_ID", "0"))
    return not path_parameters or path_parameters.get("key_id") != own
