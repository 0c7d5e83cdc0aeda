from pathlib import Path

import pytest


@pytest.fixture
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """kvscope's cache and state directories inside tmp_path."""
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KVSCOPE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path
