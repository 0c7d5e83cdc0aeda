"""How kvscope's packages depend on each other, read from the imports in src/kvscope.

The folders follow the data: config -> engines -> workload -> probe / collect -> records ->
finalize -> analysis -> report. A package may use the ones its data comes through, never the
other way round, and no two packages import each other (directly or around a cycle); inside a
package, no two modules do either. The replay simulator (sim/) is pure: numpy over records, no
engine, capture or probe; live replay (live/) drives engines and may use sim/, never the reverse.
"""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest
from helpers import ROOT

SRC = ROOT / "src" / "kvscope"
MAX_LINES = 400


def unit(path: Path) -> str:
    """The package a module belongs to (`engines`), or the top-level module (`finalize`)."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def imported_modules(path: Path) -> set[str]:
    """The kvscope modules a file imports (dotted, `kvscope.` dropped), at any depth of the file
    (inside functions and `if TYPE_CHECKING:` too); `from kvscope.x import y` gives x.y when y
    is a module, and x."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "kvscope" or len(parts) < 2:
                continue
            rel = Path(*parts[1:])
            if (SRC / rel).with_suffix(".py").exists() or (SRC / rel / "__init__.py").exists():
                out.add(".".join(parts[1:]))
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_units(path: Path) -> set[str]:
    """The kvscope packages / top-level modules a file imports, at any depth of the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if (parts[0] == "kvscope" and len(parts) > 1 and (SRC / parts[1]).exists()) or (
                parts[0] == "kvscope" and len(parts) > 1 and (SRC / f"{parts[1]}.py").exists()
            ):
                out.add(parts[1])
    return out


def graph() -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        me = unit(path)
        deps.setdefault(me, set()).update(imported_units(path) - {me})
    return deps


def test_no_import_cycle_between_packages() -> None:
    try:
        order = list(TopologicalSorter(graph()).static_order())
    except CycleError as err:
        pytest.fail(f"import cycle between kvscope packages: {' -> '.join(err.args[1])}")
    assert order.index("records") < order.index("finalize") < order.index("analysis")
    assert order.index("analysis") < order.index("report") < order.index("publish")


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("records", {"engines", "collect", "probe", "workload", "finalize", "analysis", "report"}),
        ("engines", {"collect", "probe", "workload", "analysis", "report", "capture"}),
        ("collect", {"probe", "analysis", "report", "finalize"}),
        ("finalize", {"analysis", "report", "probe", "capture", "publish"}),
        ("analysis", {"probe", "report", "finalize", "capture", "publish"}),
        ("report", {"probe", "capture", "collect", "engines"}),
        (
            "sim",
            {
                "capture",
                "probe",
                "engines",
                "collect",
                "live",
                "pipeline",
                "profiling",
                "publish",
                "workload",
                "report",
            },
        ),
        ("live", {"cli"}),
    ],
)
def test_packages_use_only_what_comes_before_them(package: str, forbidden: set[str]) -> None:
    assert graph()[package] & forbidden == set()


def test_no_import_cycle_inside_a_package() -> None:
    """Modules of one package (sub-packages included) never import each other around a circle;
    imports inside functions count (a deferred import hides a circle, it does not remove it)."""
    deps: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        me = module_name(path)
        package = me.split(".")[0]
        deps[me] = {
            m for m in imported_modules(path) if m.split(".")[0] == package and m != me
            and not me.startswith(m + ".")  # a package's own __init__ is not a module's peer
        }  # fmt: skip
    try:
        list(TopologicalSorter(deps).static_order())
    except CycleError as err:
        pytest.fail(f"import cycle inside a package: {' -> '.join(err.args[1])}")


def test_the_sim_depends_on_no_live_replay() -> None:
    """sim/ is importable with nothing but numpy, pyarrow and kvscope's records (and errors)."""
    for path in (SRC / "sim").rglob("*.py"):
        used = {m.split(".")[0] for m in imported_modules(path)}
        assert used <= {"sim", "records", "errors", "finalize", "analysis"}, (path, used)


def test_the_check_sees_imports() -> None:
    deps = graph()
    assert {"records", "collect"} <= deps["finalize"]  # module-level imports
    assert "report" in deps["cli"]  # imports inside functions count too


def test_no_module_is_long() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
