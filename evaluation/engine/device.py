"""The processor a model runs on, by name: what a latency curve and a run's provenance depend on."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(device: torch.device) -> str | None:
    """The GPU's name for a CUDA device, else None."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def processor_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's."""
    return gpu_name(device) or cpu_name()
