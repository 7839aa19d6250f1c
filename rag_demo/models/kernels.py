"""Faster CPU kernels for a float32 generator, with the same math.

PyTorch's float32 `F.linear` calls the BLAS it was built with (MKL), which picks its code path by
CPU and on some x86 CPUs runs far below them; oneDNN, also inside PyTorch's CPU build, multiplies
the same matrices faster there (docs/results.md §3.12). `onednn_linear` routes a model's float32
linear layers through oneDNN's own linear op: the same weights (ties kept), the same products
summed in another order. bfloat16 linear layers already go to oneDNN and are left alone.
"""
from __future__ import annotations

import torch


def _onednn_op():
    """oneDNN's linear op, or None where this build of PyTorch has none."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


class OneDNNLinear(torch.nn.Linear):
    """nn.Linear whose forward is oneDNN's linear (y = x Wᵀ + b), for float32 weights and inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32:  # what oneDNN's op is used for here
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def onednn_linear(model: torch.nn.Module) -> int:
    """Switch every float32 nn.Linear of `model` to `OneDNNLinear` in place (the module keeps its
    parameters, so tied weights stay tied); -> how many were switched (0 where oneDNN is missing)."""
    if _onednn_op() is None:
        return 0
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.dtype == torch.float32:
            mod.__class__ = OneDNNLinear
            n += 1
    return n
