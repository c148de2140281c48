"""The vLLM engine's path keys: validated without vLLM installed (config imports no vLLM, torch or
transformers), so these run everywhere; the engine itself is tested in test_engine.py where vLLM is installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from toolaudit import ConfigError
from toolaudit.engines.options import defaults_of
from toolaudit.engines.vllm import config as vconfig


def fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"paths.test: {key} {message}")


@pytest.mark.parametrize("table, key", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_model_len": "2k"}, "max_model_len"),
    ({"tensor_parallel_size": True}, "tensor_parallel_size"),
    ({"gpu_memory_utilization": 1.5, "device": "cuda"}, "gpu_memory_utilization"),
    ({"enforce_eager": "yes"}, "enforce_eager"),
    ({"batch_invariant": 1}, "batch_invariant"),
    ({"batch_invariant": True}, "batch_invariant"),  # CPU: vLLM 0.32's batch-invariant kernels are Triton-only
    ({"engine_args": "x"}, "engine_args"),
    ({"engine_args": {"dtype": "half"}}, "engine_args.dtype"),
    ({"prompt_format": "raw"}, "prompt_format"),
    ({"in_process": "yes"}, "in_process"),
    ({"engine_args": {"distributed_executor_backend": "mp"}}, "engine_args.distributed_executor_backend"),
    ({"dtype": "float64"}, "dtype"),
    ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
    ({"device": "cuda:1"}, "device"),
    ({"speculative": {"method": "lookahead"}}, "speculative.method"),
    ({"speculative": {"method": "eagle3"}}, "speculative.model"),
])
def test_option_errors_name_the_key(table, key):
    with pytest.raises(ConfigError) as err:
        vconfig.ENGINE.parse_options(table, fail)
    assert f"paths.test: {key} " in str(err.value)


def test_options_defaults_and_values():
    defaults = defaults_of(vconfig.VLLMOptions)
    assert vconfig.ENGINE.parse_options({}, fail) == defaults
    assert defaults["gpu_memory_utilization"] is None  # vLLM's 0.9, or what is free on the GPU if less is
    opts = vconfig.ENGINE.parse_options({"max_num_seqs": 8, "max_model_len": 2048, "enforce_eager": False,
                                  "batch_invariant": True, "device": "cuda", "gpu_memory_utilization": 0.5,
                                  "engine_args": {"kv_cache_dtype": "fp8"}, "prompt_format": "chat_template"}, fail)
    assert opts["max_num_seqs"] == 8 and opts["batch_invariant"] is True and opts["prompt_format"] == "chat_template"
    assert opts["engine_args"] == {"kv_cache_dtype": "fp8"}
    assert vconfig.ENGINE.parse_options({"in_process": True}, fail)["in_process"] is True
    assert vconfig.KEYS == frozenset(defaults)
    typed = vconfig.ENGINE.read(opts)
    assert (typed.max_num_seqs, typed.gpu_memory_utilization, typed.enforce_eager) == (8, 0.5, False)


def test_package_import_does_not_import_vllm():
    code = ("import sys, toolaudit.engines.vllm, toolaudit.engines.vllm.config; "
            "print('vllm' in sys.modules, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]


@pytest.mark.parametrize("free_gib, total_gib, wanted, expected", [
    (79.0, 80.0, 0.9, 0.9),  # an empty GPU: vLLM's own default
    (60.0, 80.0, 0.9, 0.73),  # torch paths still hold 20 GiB: what is free, less headroom
    (60.0, 80.0, 0.5, 0.5),  # a smaller share asked for stays
    (3.0, 80.0, 0.9, None),  # too little free to start: the engine says so (ConfigError)
])
def test_default_gpu_memory_share_fits_what_is_free(free_gib, total_gib, wanted, expected):
    """vLLM refuses to start when less than its share is free; a replay with torch paths on the same GPU must
    not trip that with the 0.9 default."""
    from toolaudit.engines.vllm.engine import memory_share

    assert memory_share(int(free_gib * 2**30), int(total_gib * 2**30), wanted) == expected
