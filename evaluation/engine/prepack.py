"""The target's linear layers with their weights laid out once for the CPU's matrix library (oneDNN).

A plain `nn.Linear` on the CPU hands its weight to the matrix library in PyTorch's row-major layout, and for a
few rows (a 4-16-node draft tree) the library re-lays the weight out, or takes a path tuned for large batches,
on every call: the forward of 8 tokens then costs about twice that of one, although both stream the same
weights from memory. Laying the weights out once at load (`torch.ops.mkldnn._reorder_linear_weight`, the
prepacking `torch.compile`'s CPU freezing pass uses) removes that cost. In bfloat16 it is the larger win: the
plain path converts the weights to the AMX layout on every call. Measured by `make bench-engine`
(results/engine/cpu_paths.csv).

The packed product is float32 arithmetic on the same numbers, summed in another order: logits agree with the
plain layer's within float32 rounding (tests/test_prepack.py), as two widths of the plain path already do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKABLE = (torch.float32, torch.bfloat16)


def can_prepack(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN packs weights of `dtype`: float32 wherever oneDNN is built in; bfloat16 only
    where oneDNN has a bfloat16 path (AVX512-BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has none, and its
    bfloat16 model keeps PyTorch's plain linear layers)."""
    if dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
# At one or two rows the plain float32 path (the library's matrix-vector product) is as fast as the packed one
# or faster, since oneDNN's blocked kernel pays a fixed cost per call there; vanilla decoding (one row) keeps it.
PLAIN_FLOAT32_ROWS = 2


class PrepackedLinear(nn.Module):
    """An `nn.Linear` (weight kept, so tied embeddings and readers of `.weight` are untouched) that multiplies
    through a oneDNN-packed copy of its weight, except where the plain path is the right one: one or two rows
    in float32, autograd (the packed op has no backward) and autocast (a dtype the copy was not packed for)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
            self.packed_bias = None if linear.bias is None else linear.bias.detach()
        self.plain_rows = PLAIN_FLOAT32_ROWS if linear.weight.dtype == torch.float32 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.numel() <= self.plain_rows * self.in_features or x.dtype != self.weight.dtype
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
                or torch.is_autocast_enabled("cpu")):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked for oneDNN"


def prepack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` in place by a `PrepackedLinear`; returns how many were replaced."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PrepackedLinear(child))
                replaced += 1
    return replaced
