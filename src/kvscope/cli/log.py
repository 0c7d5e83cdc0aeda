"""`kvscope log RUN`: upload a finished run directory to MLflow (kvscope/upload.py)."""

from pathlib import Path
from typing import Annotated

import typer

from kvscope.cli.common import console, friendly


@friendly
def log(
    run_dir: Annotated[
        Path, typer.Argument(help="The run directory.", exists=True, file_okay=False)
    ],
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (default: the run's own).")
    ] = None,
) -> None:
    """Log a finished run to MLflow: its params, metrics, files, traces and status, as `kvscope
    run` would have. Idempotent: a run logged already is left as it is."""
    from kvscope.upload import upload  # MLflow loads slowly

    done = upload(run_dir, tracking_uri)
    if done.already:
        console.print(f"{run_dir.name}: already logged as MLflow run {done.run_id} "
                      f"({done.tracking_uri}); nothing written")  # fmt: skip
        return
    cut = f" (replaced {done.replaced} cut-off upload(s))" if done.replaced else ""
    console.print(f"{run_dir.name}: logged as MLflow run {done.run_id} ({done.tracking_uri}){cut}")
