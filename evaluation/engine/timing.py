"""Per-part timers for the decode loop: every interval between two laps is charged to one named part."""

from __future__ import annotations

import time

# The parts of a turn, in the order a step runs them.
# "budget" is the draft budget's selection and learning (zero when the budget is off).
PARTS = ("prefill", "draft", "budget", "tree", "forward", "verify", "commit", "update")


class LapClock:
    """Charges the time since the previous lap to a part, so the parts always add up to the whole turn.

    On CUDA each lap synchronizes first; otherwise asynchronous kernels would be charged to whatever part
    happens to wait for them.
    """

    def __init__(self, device):
        # torch is imported here, not above: the report reads PARTS where torch is not installed.
        import torch

        self._sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._laps: dict[str, float] = {}
        self.start = self._now()
        self._last = self.start

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def lap(self, part: str) -> None:
        now = self._now()
        self._laps[part] = now - self._last
        self.seconds[part] += now - self._last
        self._last = now

    def last_lap(self, part: str) -> float:
        """The length of the latest interval charged to `part` (e.g. the last forward)."""
        return self._laps.get(part, 0.0)

    @property
    def elapsed(self) -> float:
        return self._last - self.start
