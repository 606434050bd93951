"""Per-user folders of the test environment, by the XDG Base Directory rules. Go: setup-envtest's
``--bin-dir`` default (``os.UserConfigDir``), here the XDG cache and state homes.

``$XDG_CACHE_HOME/miles-reconcile`` (default ``~/.cache/miles-reconcile``) holds binaries built
from the pins; ``$XDG_STATE_HOME/miles-reconcile`` (default ``~/.local/state/miles-reconcile``)
records the control planes that are running. A relative XDG value is ignored, as the rules say.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_FOLDER = "miles-reconcile"


def _xdg_home(variable: str, default: str, environ: Mapping[str, str]) -> Path:
    value = environ.get(variable, "")
    if value and Path(value).is_absolute():
        return Path(value)
    return Path.home() / default


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return _xdg_home("XDG_CACHE_HOME", ".cache", env) / APP_FOLDER


def user_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return _xdg_home("XDG_STATE_HOME", ".local/state", env) / APP_FOLDER
