"""Self-contained HTML pages: one run (`run_report`) or several side by side (`compare_report`).

Figures are embedded PNG data URIs and the CSS is inline: the file opens anywhere, offline.
A view whose data is missing is replaced by a sentence that says what is missing.
"""

from collections.abc import Sequence
from functools import cache
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.errors import KvscopeError
from kvscope.records.run_dir import REPORT_HTML
from kvscope.report.compare_sections import cross_run_sections, run_labels
from kvscope.report.compare_turns import turns_section
from kvscope.report.hints_section import hints_section
from kvscope.report.routing_section import routing_compare
from kvscope.report.run_sections import run_sections
from kvscope.report.table import NULL, Section


@cache
def _env() -> Environment:
    return Environment(
        loader=PackageLoader("kvscope.report", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_run(run: RunAnalysis) -> str:
    page = _env().get_template("report.html")
    return page.render(title=run.label, sections=run_sections(run), null=NULL)


def write_run_report(run: RunAnalysis, out: Path | None = None) -> Path:
    """Write the run's report.html (or `out`)."""
    out = out or run.run_dir / REPORT_HTML
    out.write_text(render_run(run), encoding="utf-8")
    return out


def run_report(run_dir: Path, out: Path | None = None) -> Path:
    """Analyse a run directory and write RUN/report.html (or `out`)."""
    return write_run_report(analyze_run(run_dir), out)


def analyze_runs(run_dirs: Sequence[Path]) -> list[RunAnalysis]:
    """Each run analysed once, under its short label."""
    labels = run_labels(run_dirs)
    return [analyze_run(p, label) for p, label in zip(run_dirs, labels, strict=True)]


def compare_report(run_dirs: list[Path], out: Path) -> Path:
    """Write one HTML page comparing the runs: each run's views side by side, then RQ3-RQ5."""
    if not run_dirs:
        raise KvscopeError("compare needs at least one run directory")
    data = analyze_runs(run_dirs)
    per_run = [{s.key: s for s in run_sections(d)} for d in data]
    keys = list(dict.fromkeys(k for sections in per_run for k in sections))  # first seen first
    rows = [[sections.get(k) or _absent(k, per_run) for sections in per_run] for k in keys]
    html = _env().get_template("compare.html").render(
        title=f"{len(data)} runs compared", labels=[d.label for d in data], rows=rows,
        cross=[*filter(None, [hints_section(data)]), *cross_run_sections(data),
               *filter(None, [turns_section(data)]),
               *routing_compare(data)], null=NULL,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def _absent(key: str, per_run: list[dict[str, Section]]) -> Section:
    """A run without this section (no replay, one engine): its cell says so."""
    title = next(s[key].title for s in per_run if key in s)
    return Section(key, title, "Not in this run.")
