"""Defines torchvision's two operator schemas before torchvision is first imported (realserver tests only).

Why: the registry's torchvision 0.28.0 is a CUDA build. Beside the CPU build of torch its import fails with
"operator torchvision::nms does not exist" (its Python code registers fake kernels for operators its missing
native library would have defined), and transformers imports it on SGLang's text path. Defining the schemas
`nms` and `qnms` on the `torchvision` library fragment first lets the import succeed; nothing here calls them.
`install()` is run by the one-line .pth file that setup.sh puts into the venv; the hook removes itself at its
first use.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list[Any] = []  # torch drops a fragment's definitions when its Library object is collected


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Defines the schemas when `torchvision` is first looked for, then steps aside for the real finders."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_schemas()
        return None


def define_schemas() -> None:
    """Define nms and qnms on the torchvision fragment unless they exist already."""
    import torch

    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        name = schema.partition("(")[0]
        if not hasattr(torch.ops.torchvision, name):
            library.define(schema)
    _LIBRARIES.append(library)


def install() -> None:
    """Put the one-shot hook first on sys.meta_path (once)."""
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
