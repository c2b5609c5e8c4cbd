"""What this machine can run on, and the fingerprint that keys engines to it.

GPU runtimes are probed only if installed, so a CPU-only process never imports torch.cuda
machinery just to learn there is no GPU.
"""

from __future__ import annotations

import importlib.util
import platform
from functools import cache
from pathlib import Path

import onnxruntime as ort

from precompute.models.backends.base import ConcreteDevice

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")


def onnxruntime_cuda() -> bool:
    """Whether this ONNX Runtime has its CUDA provider (onnxruntime-gpu)."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


def cuda_visible() -> bool:
    gpu_runtime = onnxruntime_cuda() or importlib.util.find_spec("tensorrt") is not None
    if not gpu_runtime:
        return False
    import torch

    return torch.cuda.is_available()


def detect_device() -> ConcreteDevice:
    return "cuda" if cuda_visible() else "cpu"


@cache
def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """The CPU's model name and its ISA flags, as /proc/cpuinfo names them (none elsewhere); read
    once per process: every ladder (native_bf16) and every engine key (device_fingerprint) asks."""
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                model = value.strip()
            elif name.strip() == "flags":
                flags = frozenset(value.split())
                break
    return model, flags


def native_bf16() -> bool:
    """Whether this CPU multiplies BF16 matrices in hardware (AMX-BF16 tiles), where PyTorch's
    oneDNN kernels run MPNet in BF16 markedly faster than in FP32 (`precompute bench
    embed`; docs/engines.md)."""
    return "amx_bf16" in cpu_model_and_flags()[1]


def int8_saturates() -> bool:
    """Whether this x86 CPU multiplies INT8 without VNNI (AVX2, AVX-512 without VNNI): ONNX
    Runtime's u8 x s8 kernels there add pairs of products into int16 (VPMADDUBSW), which saturates
    where activations and weights are both large, and its documented remedy is 7-bit weights
    (`reduce_range`). MPNet's dynamic INT8 graph kept a mean cosine of 0.003 to FP32 without it on
    an AVX2 CPU (`precompute bench embed --model`)."""
    flags = cpu_model_and_flags()[1]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and not {"avx512_vnni", "avx_vnni", "amx_int8"} & flags


def device_fingerprint(device: ConcreteDevice) -> str:
    """GPU model and compute capability, or CPU model and the ISA extensions INT8 and BF16 kernels use."""
    if device == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"cuda:{torch.cuda.get_device_name()}:sm_{major}{minor}"
    model, flags = cpu_model_and_flags()
    return f"cpu:{model}:{'+'.join(f for f in CPU_FLAGS if f in flags)}"
