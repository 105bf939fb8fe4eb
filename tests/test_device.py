"""study.device: the peak table, MFU, peak memory, compile policy; the GPU path (CUDA tests skip without one)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny
from study import device as D
from study.train import MemorySink, train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs these)")


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H200", 989.4e12), ("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA L40S", 362.1e12), ("NVIDIA L4", 121e12),
    ("cpu (x86_64, 2 threads)", None),
])
def test_peak_table(monkeypatch, name, peak):
    monkeypatch.delenv("SWEEP_PEAK_FLOPS", raising=False)
    assert D.peak_flops(name) == peak


def test_mfu_is_model_flops_over_peak(monkeypatch):
    monkeypatch.delenv("SWEEP_PEAK_FLOPS", raising=False)
    assert D.mfu(6e8, 1e5, "NVIDIA H200") == pytest.approx(6e13 / 989.4e12)
    assert D.mfu(6e8, 1e5, "cpu") is None and D.mfu(6e8, 0.0, "NVIDIA H200") is None
    monkeypatch.setenv("SWEEP_PEAK_FLOPS", "1e12")
    assert D.mfu(1e6, 1e5, "cpu") == pytest.approx(0.1)


def test_compile_and_precision_policy():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert D.should_compile("auto", gpu, D.COMPILE_MIN_PARAMS) and not D.should_compile("auto", gpu, D.COMPILE_MIN_PARAMS - 1)
    assert not D.should_compile("auto", cpu, 10**9) and D.should_compile(True, cpu, 1)
    assert D.use_bf16("auto", gpu) and not D.use_bf16("auto", cpu) and D.use_bf16("bf16", cpu) and not D.use_bf16("fp32", gpu)
    # fp32 means full fp32 on a GPU too (no TF32 matmuls): a GPU trial then differs from a CPU one only in sum order
    assert D.use_tf32("auto", gpu) and D.use_tf32("bf16", gpu) and not D.use_tf32("fp32", gpu)
    assert not D.use_tf32("auto", cpu)


def test_cpu_run_row_records_peak_rss_and_no_mfu(monkeypatch):
    monkeypatch.delenv("SWEEP_PEAK_FLOPS", raising=False)
    sink = MemorySink()
    train(tiny(6, 3, runtime={"device": "cpu"}), sink)
    row = sink.run_row
    assert row["mfu"] is None and row["peak_memory_bytes"] > 50 * 2**20  # torch alone is more than 50 MiB
    monkeypatch.setenv("SWEEP_PEAK_FLOPS", "1e11")
    train(tiny(6, 3, runtime={"device": "cpu"}), sink)
    assert sink.run_row["mfu"] == pytest.approx(tiny(6, 3, runtime={"device": "cpu"}).flops_per_token * sink.run_row["tokens_per_s"] / 1e11)


def test_cpu_model_is_read_from_proc_cpuinfo_else_lscpu_else_platform(monkeypatch, tmp_path):
    import builtins
    import platform
    import subprocess

    model = D.cpu_model()
    assert model and model != "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            named = [" ".join(l.split(":", 1)[1].split()) for l in f if l.startswith("model name")]
    except OSError:
        named = []
    if named:
        assert model == named[0]
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: (_ for _ in ()).throw(OSError("no /proc"))
                        if p == "/proc/cpuinfo" else real_open(p, *a, **k))
    lscpu = subprocess.CompletedProcess(["lscpu"], 0, stdout="Architecture: x86_64\nModel name:   Some  CPU 9000\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: lscpu)
    assert D.cpu_model() == "Some CPU 9000"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no lscpu")))
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert D.cpu_model() == "arm"


def test_cpu_names_have_no_peak_even_when_the_model_holds_a_table_key(monkeypatch):
    monkeypatch.delenv("SWEEP_PEAK_FLOPS", raising=False)
    assert D.peak_flops("cpu (Imaginary T4 A100 Processor, 2 threads)") is None


def test_run_row_records_the_cpu_model_and_torch_kernel_path():
    """Results differ across CPU models and kernel paths (docs/reproducibility.md): every row says which."""
    sink = MemorySink()
    train(tiny(2, 3, runtime={"device": "cpu"}), sink)
    row = sink.run_row
    assert D.cpu_model() in row["device"] and row["device"].startswith("cpu (")
    assert D.cpu_model() in row["device_detail"]
    assert f"torch cpu kernels {torch.backends.cpu.get_cpu_capability()}" in row["device_detail"]
    assert "sm_" not in row["device_detail"]  # no GPU named on a CPU trial


def test_bf16_autocast_on_cpu_trains():
    sink = MemorySink()
    s = train(tiny(6, 3, runtime={"device": "cpu", "precision": "bf16"}), sink)
    assert s.status == "done" and math.isfinite(s.final_val_loss)


@pytest.mark.slow
def test_compiled_trial_matches_eager_on_cpu():
    """torch.compile (the CUDA default from COMPILE_MIN_PARAMS) runs on CPU too; same losses to fp tolerance."""
    eager, compiled = MemorySink(), MemorySink()
    a = train(tiny(4, 3, runtime={"device": "cpu", "compile": False}), eager)
    b = train(tiny(4, 3, runtime={"device": "cpu", "compile": True}), compiled)
    assert b.status == "done"
    assert b.final_val_loss == pytest.approx(a.final_val_loss, rel=1e-3)


# ---- CUDA only --------------------------------------------------------------------------------


@cuda
def test_cuda_run_row_names_the_gpu_and_its_host():
    detail = D.device_detail(torch.device("cuda"))
    assert torch.cuda.get_device_name() in detail and "sm_" in detail and D.cpu_model() in detail


@cuda
@pytest.mark.cuda
def test_cuda_trial_records_mfu_and_peak_memory():
    sink = MemorySink()
    cfg = tiny(20, 3, runtime={"device": "cuda"})
    train(cfg, sink)
    row = sink.run_row
    assert row["mfu"] is not None and 0 < row["mfu"] < 1
    assert 0 < row["peak_memory_bytes"] < torch.cuda.get_device_properties(0).total_memory


@cuda
@pytest.mark.cuda
def test_cuda_memory_fraction_caps_allocations():
    """A quarter-GPU trial cannot allocate more than a quarter of the device."""
    import subprocess
    import sys

    code = ("import torch; from study.device import limit_memory; d = torch.device('cuda'); limit_memory(0.25, d); "
            "total = torch.cuda.get_device_properties(0).total_memory\n"
            "try:\n    torch.empty(int(total * 0.3), dtype=torch.uint8, device=d); print('allocated')\n"
            "except torch.OutOfMemoryError:\n    print('refused')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "refused", f"stdout {proc.stdout!r}, exit {proc.returncode}, stderr:\n{proc.stderr[-2000:]}"
