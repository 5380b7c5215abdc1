"""The shared decoding machinery that every method in `baselines/` and `logitspec/` runs on."""

from evaluation.engine.loop import TurnResult, decode_turn
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.registry import available_methods, method_class, register_method
from evaluation.engine.tree import DraftTree, SideNodes

__all__ = [
    "DecodeState", "DraftTree", "Method", "SideNodes", "StepOutcome", "TurnResult",
    "available_methods", "decode_turn", "method_class", "register_method",
]
