"""kvscope's probe in a program run by `kvscope profile` (on PYTHONPATH only while profiling).

Python imports this module at the start of every interpreter; with KVSCOPE_CAPTURE set it attaches
kvscope's probe (kvscope.probe.child.attach), then runs the `sitecustomize` this one shadows, if
the environment has one. In an interpreter without kvscope (or without kvscope's dependencies:
an app in a virtualenv of its own) it attaches the lite probe instead (kvscope.probe.lite, from
KVSCOPE_PROBE_PATH, put at the end of sys.path). A probe that cannot load says so on stderr and
the program runs on.
"""

import contextlib
import importlib
import importlib.util
import os
import sys


def _attach() -> None:
    spec = os.environ.get("KVSCOPE_CAPTURE")
    if not spec:
        return
    try:
        if importlib.util.find_spec("kvscope") is not None:
            try:
                from kvscope.probe.child import attach

                attach(spec)
                return
            except ImportError:  # kvscope without its dependencies here: the lite probe
                pass
        elif os.environ.get("KVSCOPE_PROBE_PATH"):
            sys.path.append(os.environ["KVSCOPE_PROBE_PATH"])
        else:
            raise ImportError("kvscope is not installed here and no KVSCOPE_PROBE_PATH was given")
        from kvscope.probe.lite import attach as attach_lite

        attach_lite(spec)
    except Exception as err:  # the program must run, profiled or not
        print(
            f"kvscope: the probe did not load in {sys.executable} ({type(err).__name__}: {err});"
            " this process's calls are not profiled",
            file=sys.stderr,
        )


def _chain() -> None:
    """Import the next `sitecustomize` on sys.path (the one this module shadows)."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    this = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        with contextlib.suppress(ImportError):
            importlib.import_module("sitecustomize")
    finally:
        sys.path[:] = saved
        if this is not None:
            sys.modules["sitecustomize"] = this


_attach()
_chain()
