"""The report's sections in a terminal: the same tables and notes as report.html, drawn by rich."""

from rich.console import Console
from rich.table import Table as RichTable

from kvscope.report.table import Section, Table


def rich_table(view: Table) -> RichTable:
    out = RichTable(title=view.title or None, title_justify="left", show_header=any(view.headers))
    for head, text in zip(view.headers, view.text or [False] * len(view.headers), strict=True):
        out.add_column(head, justify="left" if text else "right", no_wrap=text)
    for row in view.rows:
        out.add_row(*row)
    return out


def print_section(console: Console, section: Section, label: str = "") -> None:
    """Title, notes, then each table."""
    console.print(f"\n[bold]{section.title}[/]" + (f" ({label})" if label else ""))
    for note in section.notes:
        console.print(note, style="dim", highlight=False)
    for view in section.tables:
        console.print(rich_table(view))
