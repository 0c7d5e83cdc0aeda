from pathlib import Path

import pytest


@pytest.fixture
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """kvscope's cache and state directories inside tmp_path."""
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KVSCOPE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


_NEEDS_VENVS = ("frameworks", "integration", "sglang_live")  # folders whose tests use one


def pytest_collection_finish(session: pytest.Session) -> None:
    """Where a selected test may run an app in a framework's own virtualenv, the missing
    virtualenvs are made from now on, beside the first tests (framework_venv.prefetch)."""
    root = Path(__file__).parent
    folders = {item.path.relative_to(root).parts[0] for item in session.items
               if item.path.is_relative_to(root)}  # fmt: skip
    if folders & set(_NEEDS_VENVS) and not session.config.option.collectonly:
        from framework_venv import prefetch

        prefetch()
