"""Where kvscope keeps installed engines, converted models and running-engine state."""

import os
from pathlib import Path

from platformdirs import user_cache_path, user_state_path


def cache_dir() -> Path:
    """Engine virtual environments and converted models (large, rebuildable)."""
    override = os.environ.get("KVSCOPE_CACHE_DIR")
    return Path(override) if override else user_cache_path("kvscope")


def state_dir() -> Path:
    """State of engines started by `kvscope engine up` (small, per user)."""
    override = os.environ.get("KVSCOPE_STATE_DIR")
    return Path(override) if override else user_state_path("kvscope")
