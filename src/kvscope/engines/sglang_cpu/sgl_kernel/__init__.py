"""A compatibility shim for SGLang's native `sgl_kernel` wheel, which the package index has for
CUDA only. Installed by kvscope into its SGLang CPU environment (engines/sglang_install.py); it is
not a model and not an engine: all model compute stays SGLang's own torch code.

With `SGLANG_USE_CPU_ENGINE=1` SGLang imports a few `*_cpu` ops at module level. On a CPU without
AMX only `assign_req_to_token_pool_cpu` is called (every batch); it is given here in torch with
the semantics of SGLang's triton kernel `mem_cache.allocation.assign_req_to_token_pool`. Any other
op can be imported but raises `NotImplementedError` naming itself when called, so a code path that
needs a real native kernel fails loudly instead of computing something else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the op needs tensor methods only: importing this package imports no torch
    import torch

__version__ = "0.0.0+kvscope-cpu-shim"
SHIM = True  # kvscope checks this to name the package in its environment record


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[r, start:end] = out_cache_loc[offset:offset + end - start], per request r;
    the offsets run over the requests in order (the triton kernel's prefix sum)."""
    del pool_len  # the row stride; req_to_token is indexed by row here
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + n]
        offset += n


class _MissingOp:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{self.name} was called, but this is kvscope's CPU compatibility shim "
            "for sgl_kernel: only assign_req_to_token_pool_cpu is implemented. This SGLang code "
            "path needs the native sgl_kernel (a GPU build, or a CPU build compiled from source)"
        )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _MissingOp(name)
