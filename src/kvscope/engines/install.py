"""Isolated virtual environments for engines: an engine's pins never touch kvscope's own."""

import json
import subprocess
import venv
from collections.abc import Callable, Sequence
from pathlib import Path

from kvscope.errors import EngineError

Report = Callable[[str], None]
MARKER = "kvscope-install.json"


def venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def installed_spec(root: Path) -> dict[str, object] | None:
    try:
        return json.loads((root / MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_logged(argv: Sequence[str], log: Path, what: str, report: Report) -> None:
    """Run a step, streaming its last output line to `report`; fail with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.strip():
                report(f"{what}: {line.strip()[:100]}")
        code = proc.wait()
    if code != 0:
        lines = log.read_text(errors="replace").splitlines()[-15:]
        raise EngineError(f"{what} failed (exit {code}); log: {log}\n" + "\n".join(lines))


def ensure_venv(
    root: Path,
    requirements: Sequence[str],
    *,
    remove: Sequence[str] = (),
    report: Report,
) -> Path:
    """Create `root` with `requirements` installed; a no-op when the same spec is there."""
    spec = {"requirements": list(requirements), "remove": list(remove)}
    if installed_spec(root) == spec and venv_python(root).exists():
        return venv_python(root)
    log = root.parent / f"{root.name}.install.log"
    if not venv_python(root).exists():
        report(f"creating {root}")
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
    py = str(venv_python(root))
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    run_logged([*pip, "install", *requirements], log, "pip install", report)
    if remove:
        run_logged([*pip, "uninstall", "-y", *remove], log, "pip uninstall", report)
    (root / MARKER).write_text(json.dumps(spec))
    return venv_python(root)


def dist_versions(root: Path, names: Sequence[str]) -> dict[str, str | None]:
    """Installed versions in a venv, read from its dist-info folders (no interpreter start)."""
    found: dict[str, str] = {}
    for info in root.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").partition("-")
        found[name.lower().replace("_", "-")] = version
    return {n: found.get(n.lower().replace("_", "-")) for n in names}
