"""What `kvscope profile` says when a program's run has no rows (cli/profile.py)."""

import pytest

from kvscope.cli.profile import _explain_empty, isolating_flags


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["python", "-I", "app.py"], ["-I"]),
        (["/venv/bin/python3", "-IS", "-m", "app"], ["-I", "-S"]),
        (["python3.11", "-u", "-E", "app.py", "-I"], ["-E"]),  # the script's own -I is its
        (["python", "app.py"], []),
        (["python", "-c", "print(1)"], []),
        (["uv", "run", "-I", "app.py"], []),  # not Python's own options
    ],
)
def test_isolating_flags(command: list[str], flags: list[str]) -> None:
    assert isolating_flags(command) == flags


def test_the_flag_is_named_when_the_probe_did_not_load(capsys: pytest.CaptureFixture) -> None:
    _explain_empty(0, [], "http://e:8000/v1", ["python", "-I", "app.py"])
    err = " ".join(capsys.readouterr().err.split())
    assert "the probe did not load" in err and "Python's -I keeps it from reading" in err
    _explain_empty(0, [], "http://e:8000/v1", ["python", "app.py"])
    assert "no Python process of it loaded" in " ".join(capsys.readouterr().err.split())
    _explain_empty(3, [], "http://e:8000/v1", ["python", "-I", "app.py"])
    assert capsys.readouterr().err == ""  # rows: nothing to explain
