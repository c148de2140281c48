"""The vLLM device pack's consistency check (scripts/device/vllm_pack.py, `make gpu-pack-vllm`), on small wheels
built here: every requirement of every packed wheel is met by a packed wheel, the device image or a reason to
leave it out, one version of each distribution, markers and extras as the device's Python reads them."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from conftest import REPO
from packaging.version import Version

sys.path.insert(0, str(REPO / "scripts" / "device"))
import vllm_pack  # noqa: E402


def wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *(f"Requires-Dist: {r}" for r in requires)]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


def test_a_consistent_pack_passes_and_says_what_it_assumed(tmp_path):
    wheels = [wheel(tmp_path, "vllm", "0.26.0", "torch==2.11.0", "fastapi[standard]>=0.1", "numpy",
                    "torchaudio==2.11.0", 'six; python_version > "3.11"', 'winreg-thing; sys_platform == "win32"'),
              wheel(tmp_path, "fastapi", "0.135.0", 'uvicorn>=0.30; extra == "standard"', "starlette"),
              wheel(tmp_path, "uvicorn", "0.54.0"), wheel(tmp_path, "starlette", "1.10.0"),
              wheel(tmp_path, "six", "1.17.0")]
    device = {"torch": Version("2.11.0+cu130"), "numpy": None}
    problems, notes = vllm_pack.check(wheels, device, {"torchaudio": "audio models only"})
    assert problems == []
    assert "vllm requires torchaudio==2.11.0: left out (audio models only)" in notes
    assert not any("winreg" in n for n in notes + problems)  # a Windows-only requirement does not apply


def test_each_kind_of_inconsistency_is_named(tmp_path):
    """The conflict the first resolver made (each wheel's newest version on its own): vLLM 0.26 pins
    apache-tvm-ffi 0.1.10 and the newest xgrammar needs 0.1.11."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    wheels = [wheel(tmp_path, "vllm", "0.26.0", "torch==2.11.0", "xgrammar", "apache-tvm-ffi==0.1.10", "lark"),
              wheel(tmp_path, "xgrammar", "0.2.9", "apache-tvm-ffi>=0.1.11"),
              wheel(tmp_path / "a", "apache-tvm-ffi", "0.1.10")]
    problems, _ = vllm_pack.check(wheels, {"torch": Version("2.13.0")}, {})
    assert sorted(problems) == sorted([
        "xgrammar requires apache-tvm-ffi>=0.1.11, but apache-tvm-ffi 0.1.10 is packed",
        "vllm requires torch==2.11.0, but the device has torch 2.13.0",
        "vllm requires lark: neither packed, on the device, nor left out with a reason"])
    twice, _ = vllm_pack.check([*wheels, wheel(tmp_path / "b", "apache-tvm-ffi", "0.1.12")],
                               {"torch": Version("2.11.0")}, {"lark": "not on the path"})
    assert "apache-tvm-ffi: two versions packed (0.1.10 and 0.1.12)" in twice


def test_the_device_list_reads_names_and_recorded_versions():
    device = vllm_pack.device_packages(REPO / "scripts" / "device" / "device_has.txt")
    assert device["torch"] == Version("2.11.0") and "transformers" in device and device["transformers"] is None
