"""A stand-in for SGLang's kernel library (`sgl_kernel`) on a CPU machine, for the realserver tests only.

Why: SGLang's CPU path imports the CPU build of `sgl_kernel` when it loads (its KV-cache move and allocation
modules). No package registry ships that build: `sgl-kernel`/`sglang-kernel` have no source distribution and
their wheels hold only CUDA objects. With this package first on PYTHONPATH every `from sgl_kernel import X`
succeeds, SGLang finds no AMX kernels and runs its plain-torch layers, and the one function the text path calls
is done here in plain torch. Submodules (`sgl_kernel.scalar_type`, ...) do not exist: SGLang has a fallback for
each ImportError there. Any other function raises NotImplementedError naming itself, so an SGLang upgrade
that calls a new one on the text path says which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Request i takes the next end_offset[i] - start_offset[i] entries of out_cache_loc (requests in order) and
    stores them at req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]].
    """
    del pool_len  # the row width; the kernel uses it for its address arithmetic, slicing needs none
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def _missing(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel stand-in: {name} is not implemented (only the CPU text path is)")

    missing.__name__ = missing.__qualname__ = name.rpartition(".")[2]
    return missing


def __getattr__(name: str) -> Any:
    """Every public name of sgl_kernel imports: a function that raises NotImplementedError naming itself."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"{__name__}.{name}")
