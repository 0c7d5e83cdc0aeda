"""Declares torchvision's two C++ op schemas on CPU torch just before torchvision is imported.

The package index holds torchvision only as a CUDA build; installed without its dependencies
beside CPU torch, its import fails with "operator torchvision::nms does not exist" (its
`_meta_registrations` register fakes for ops whose library did not load). Declaring the schemas
first lets the import succeed; calling nms itself would still fail (SGLang's text models never
do). Loaded in every process of kvscope's SGLang CPU environment through
kvscope-torchvision-ops.pth in its site-packages; it imports nothing until torchvision is asked
for, so other programs in that environment start as fast as before.
"""

import importlib.abc
import sys
from typing import Any


def declare() -> None:
    """Define torchvision::nms and torchvision::qnms (schemas only) unless already defined."""
    import torch

    try:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # already defined: a real torchvision library loaded first
        return
    globals()["_lib"] = lib  # a Library that is garbage-collected unregisters its ops


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """On the first `import torchvision`: declare the ops, step aside, let the import go on."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            declare()
        return None


def install() -> None:
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


install()
