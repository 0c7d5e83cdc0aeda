"""Runs inside .venv-sglang, not kvscope's venv: SGLang's own code on kvscope's launch flags.

stdin:  {"argvs": [[flag, ...], ...], "resolve": bool}, each argv being what follows
        `-m sglang.launch_server` in kvscope's launch command.
stdout: {"resolve_unavailable": str | null, "results": [one per argv: {
            "fields": ServerArgs as a dict, as prepare_server_args() parsed it,
            "kv_events": KVEventsConfig.from_cli(kv_events_config) as a dict, or null,
            "kv_events_fields": the names KVEventsConfig knows,
            "resolve_error": "Type: message" when ServerArgs.resolve_once() refused it, or null}]}
An unknown flag ends the process with argparse's exit code 2, as `sglang serve` would.
"""

import dataclasses
import importlib.util
import json
import sys
from typing import Any

_keep: list[Any] = []  # torch.library registrations last as long as their Library object


def declare_torchvision_ops() -> None:
    """PyPI's torchvision is a CUDA build: on CPU torch it imports only once these ops exist."""
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _keep.append(lib)


def as_dict(args: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(args):  # ServerArgs before 0.5.23
        return dataclasses.asdict(args)
    import msgspec

    return msgspec.structs.asdict(args)  # 0.5.23: ServerArgs is a msgspec.Struct


def resolve_error(prepare: Any, argv: list[str]) -> str | None:
    try:
        prepare(argv).resolve_once()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def main() -> None:
    request = json.load(sys.stdin)
    out, sys.stdout = sys.stdout, sys.stderr  # SGLang's own prints must not corrupt the JSON
    missing = [m for m in ("transformers", "torchvision") if importlib.util.find_spec(m) is None]
    unavailable = f"not installed in {sys.prefix}: {', '.join(missing)}" if missing else None
    resolve = request["resolve"] and unavailable is None
    if "torchvision" not in missing:  # where it is installed, transformers imports it
        declare_torchvision_ops()

    from sglang.srt.disaggregation.kv_events import KVEventsConfig
    from sglang.srt.server_args import prepare_server_args

    results = []
    for argv in request["argvs"]:
        fields = as_dict(prepare_server_args(argv))
        raw_events = fields.get("kv_events_config")
        events = KVEventsConfig.from_cli(raw_events).model_dump() if raw_events else None
        results.append(
            {
                "fields": fields,
                "kv_events": events,
                "kv_events_fields": sorted(KVEventsConfig.model_fields),
                "resolve_error": resolve_error(prepare_server_args, argv) if resolve else None,
            }
        )
    report = {"resolve_unavailable": unavailable if request["resolve"] else None}
    out.write(json.dumps({**report, "results": results}, default=str))


if __name__ == "__main__":
    main()
