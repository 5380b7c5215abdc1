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


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags as the kernel reports them (Linux), e.g. avx2, avx512f, amx_bf16."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# The flags this project's choices follow: which kernels the matrix library can take (named in results/engine/).
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "amx_fp16")


def native_bfloat16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), so that bfloat16 runs faster than float32."""
    flags = cpu_flags()
    if flags:
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    probe = getattr(torch._C._cpu, "_is_avx512_bf16_supported", None)  # no /proc/cpuinfo: ask torch
    return bool(probe and probe())


def gpu_name(device: torch.device) -> str | None:
    """The GPU's name for a CUDA device, else None."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def processor_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's."""
    return gpu_name(device) or cpu_name()
