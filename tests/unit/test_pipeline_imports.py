"""What the pipeline loads into a profiled app's process before its run concludes: the capture
side only. The analysis (duckdb), finalize, MLflow and matplotlib load when the run is
concluded, so the app's garbage collector does not walk their objects while the app runs."""

import subprocess
import sys

CHILD = """
import sys
import kvscope.pipeline
import kvscope.profiling
later = ("duckdb", "mlflow", "matplotlib", "kvscope.analysis.run", "kvscope.finalize")
print(*[m for m in later if m in sys.modules])
from kvscope.analysis.run import analyze_run  # the stage itself still imports cleanly
"""


def test_a_profiled_app_loads_no_analysis_until_the_run_concludes() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.split() == []
