"""Which chip runs a path: a different accelerator or CPU model is a different numerical path, so in-process
engines (torch, hf, vllm) name it in their fingerprints the same way. torch is imported only for CUDA devices."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name (`model name` in /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """The accelerator's name for `cuda` / `cuda:N` devices, else the CPU's model name."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_name()
