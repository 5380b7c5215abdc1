"""The decoding engine, a library every method runs on: one decode loop, one preallocated KV cache, one tree
forward, one verification, one sampling rule, one clock and the draft budget.

It imports torch, transformers and itself only. The names below load on first use, so importing a light module of
the engine (`evaluation.engine.errors`, `.timing`) does not import torch.
"""

import importlib

_EXPORTS = {
    "TurnResult": "loop", "decode_turn": "loop",
    "DecodeState": "method", "Method": "method", "StepOutcome": "method",
    "DraftTree": "tree", "SideNodes": "tree",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
