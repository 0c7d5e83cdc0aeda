"""How a run ended: run.json's `status`, copied into summary.json and the MLflow run.

    complete      every planned workflow ran (failed calls may still be rows: see `failed_calls`)
    engine_died   the engine died during the run: kvscope stopped sending; `engine_died_at`,
                  `calls_before_engine_death` and `workflows_not_run` say when and what was lost
    failed        the run stopped on an error (its message in `reason`)
    interrupted   Ctrl-C or SIGTERM

What was measured is kept in every case; only `complete` means the numbers cover the whole
workload. A count that is not known (an app's own workflows) is None.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kvscope.records.requests import STATUS_OK
from kvscope.records.run_dir import RUN_JSON, read_run_json

State = Literal["complete", "engine_died", "failed", "interrupted"]


@dataclass(frozen=True)
class RunStatus:
    state: State
    reason: str | None  # why the run did not complete, in words
    calls: int  # rows written (every request sent has one)
    failed_calls: int
    engine_died_at: str | None = None  # ISO 8601 UTC of the first sign
    calls_before_engine_death: int | None = None  # successful calls that ended before it
    workflows_planned: int | None = None
    workflows_not_run: int | None = None

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(
        cls,
        rows: Iterable[Mapping[str, Any]],
        *,
        death: tuple[int, str] | None = None,  # (at_ns, reason)
        failure: BaseException | None = None,
        planned: int | None = None,
        ran: int | None = None,
    ) -> "RunStatus":
        rows = list(rows)
        failed = sum(r.get("status") != STATUS_OK for r in rows)
        not_run = None if planned is None or ran is None else planned - ran
        common = {"calls": len(rows), "failed_calls": failed, "workflows_planned": planned,
                  "workflows_not_run": not_run}  # fmt: skip
        if death is not None:
            at_ns, why = death
            before = sum(r.get("status") == STATUS_OK and r["end_ns"] <= at_ns for r in rows)
            at = datetime.fromtimestamp(at_ns / 1e9, UTC).isoformat()
            lost = f"; {not_run} workflow(s) not run" if not_run else ""
            reason = f"the engine died at {at} after {before} successful call(s){lost}: {why}"
            return cls("engine_died", reason, engine_died_at=at,
                       calls_before_engine_death=before, **common)  # fmt: skip
        if isinstance(failure, KeyboardInterrupt | SystemExit):
            return cls("interrupted", "interrupted (Ctrl-C or SIGTERM)", **common)
        if failure is not None:
            return cls("failed", f"{type(failure).__name__}: {failure}".rstrip(": "), **common)
        if not_run:
            return cls("failed", f"{not_run} workflow(s) not run", **common)
        return cls("complete", None, **common)


def write_status(
    run_dir: Path, status: RunStatus, workload: Mapping[str, Any] | None = None
) -> None:
    """run.json's `status` (and `workload`: what the driver knew, for `kvscope log`)."""
    run = read_run_json(run_dir)
    run["status"] = status.to_dict()
    if workload is not None:
        run["workload"] = dict(workload)
    (run_dir / RUN_JSON).write_text(json.dumps(run, indent=2, default=str))


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """run.json's status; None for a run recorded before kvscope wrote one."""
    return read_run_json(run_dir).get("status")
