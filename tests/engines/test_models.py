"""The GGUF conversion's shared reads (`models._one_gguf_parse`): one parse per file while it lasts, gguf's own
names back afterwards. The converted bytes are the same with and without it (measured on SmolLM2: every file
of the cache identical, 26 s -> 13 s; docs/benchmarks.md); here, on a GGUF of a few bytes, what makes that so."""

from __future__ import annotations

import gguf
import numpy as np

from toolaudit.engines.models import _one_gguf_parse


def _tiny_gguf(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_one_parse_per_file_while_converting_and_gguf_restored_after(tmp_path):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _one_gguf_parse():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again  # the config, tokenizer and weights loaders share one parse
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        tensor = first.tensors[0]
        assert tensor.name == "token_embd.weight"
        assert np.array_equal(np.asarray(tensor.data).reshape(3, 4), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)  # outside, each caller parses for itself
