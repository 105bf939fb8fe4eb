"""The device a trial runs on: peak FLOP/s (THE table), MFU, peak memory, GPU share, compile policy.

MFU = model FLOPs per token (TrialConfig.flops_per_token: 6 N + attention) x tokens/s / the
device's peak. The peak is the dense bf16 tensor-core figure of the vendor's datasheet (no
2:4 sparsity), looked up by the name torch reports; a device not in the table (every CPU)
has no peak and so no MFU, unless $SWEEP_PEAK_FLOPS gives one.

Peak memory: torch.cuda.max_memory_allocated on CUDA (tensors only, since the trial began;
the caching allocator's reserve and the CUDA context are not counted). On CPU the process's
peak resident set (getrusage ru_maxrss): it includes the interpreter, torch and, under Ray,
the worker's own baggage, and it never resets, so it bounds the trial from above.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `sweep plan` reads the peak table without it
    import torch

__all__ = [
    "PEAK_FLOPS", "COMPILE_MIN_PARAMS", "peak_flops", "mfu", "reset_peak_memory",
    "peak_memory_bytes", "limit_memory", "should_compile", "use_bf16", "cpu_model", "device_detail",
]

PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    # (substring of torch.cuda.get_device_name, dense bf16/fp16 tensor FLOP/s); first match wins
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("GH200", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312.0e12),
    ("L40S", 362.1e12),
    ("L4", 121.0e12),
    ("A10", 125.0e12),
    ("V100", 125.0e12),  # fp16; no bf16 tensor cores
    ("T4", 65.0e12),  # fp16
)
"""Dense tensor-core peaks from NVIDIA's datasheets (the H200/H100 SXM figure is 1979 with sparsity)."""

COMPILE_MIN_PARAMS = 20_000_000
"""`compile: auto` compiles CUDA trials from this many parameters (below, compile time dominates)."""


def peak_flops(name: str) -> float | None:
    """Dense peak FLOP/s of the device called `name`, or None when unknown (CPUs)."""
    override = os.environ.get("SWEEP_PEAK_FLOPS")
    if override:
        return float(override)
    if name.startswith("cpu"):  # a CPU model name may contain a table key ("... T4 ...")
        return None
    for key, peak in PEAK_FLOPS:
        if key in name:
            return peak
    return None


def mfu(flops_per_token: float, tokens_per_s: float, name: str) -> float | None:
    """Model FLOPs utilisation in [0, 1]: flops_per_token x tokens_per_s / peak(name)."""
    peak = peak_flops(name)
    if peak is None or not tokens_per_s or tokens_per_s != tokens_per_s:
        return None
    return flops_per_token * tokens_per_s / peak


def reset_peak_memory(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak tensor memory on CUDA since reset_peak_memory; the process's peak RSS on CPU."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "cpu":
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux
    return None


def limit_memory(fraction: float | None, device: torch.device) -> None:
    """Cap this process's CUDA allocations at `fraction` of the device (a fractional-GPU trial
    must not starve the trials it shares the device with); a no-op off CUDA or at 1."""
    import torch

    if fraction is not None and fraction < 1 and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def should_compile(setting: bool | str, device: torch.device, params: int) -> bool:
    """True/False as given; `auto` compiles CUDA trials of at least COMPILE_MIN_PARAMS."""
    if setting == "auto":
        return device.type == "cuda" and params >= COMPILE_MIN_PARAMS
    return bool(setting)


def use_bf16(precision: str, device: torch.device) -> bool:
    """bf16 autocast: `auto` on CUDA only; `bf16` anywhere (CPU autocast too); `fp32` never."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def use_tf32(precision: str, device: torch.device) -> bool:
    """TF32 matmuls (a 10-bit mantissa) on CUDA, except under `fp32`: there every product is
    full fp32, as on a CPU, so a GPU trial and a CPU trial of one config differ only in the order
    of their sums."""
    return device.type == "cuda" and precision != "fp32"


def cpu_model() -> str:
    """The host CPU's model name: /proc/cpuinfo's "model name", else lscpu's "Model name",
    else platform.processor() or the machine type (macOS, or a kernel that hides it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                return " ".join(line.split(":", 1)[1].split())
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_detail(device: torch.device) -> str:
    """What decides a trial's floating-point results beyond its config (the runs column
    `device_detail`): the GPU's name, compute capability and CUDA version on CUDA; the host CPU
    model and the CPU kernel path torch dispatches to (AVX2, AVX512, ...) everywhere; BLAS."""
    import torch

    parts = []
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        parts.append(f"{torch.cuda.get_device_name(device)} (sm_{major}{minor}, CUDA {torch.version.cuda})")
    parts.append(f"cpu {cpu_model()} ({platform.machine()})")
    get_capability = getattr(torch.backends.cpu, "get_cpu_capability", None)
    if get_capability is not None:
        parts.append(f"torch cpu kernels {get_capability()}")
    if torch.backends.mkl.is_available():
        parts.append("MKL")
    return "; ".join(parts)
