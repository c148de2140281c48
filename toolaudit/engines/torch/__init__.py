"""The embedded engine: replays requests through a Hugging Face model in-process (CPU or CUDA).

It is the reference implementation, small enough to read and exact in float64 (see `loop`). Modules:
`engine` (TorchEngine), `loop` (the decode loop), `kv` (the batched KV cache), `attention` (the split cache
layer and the attention that reads it), `prefix_cache`, `proposers` (speculation), `models` (loading weights
with its own attention and kernels), `gemm` (prepacked linears), `numerics` (bf16/fp16 emulated on float32
kernels where the CPU lacks them), `config` (its path keys and `ENGINE`, the registry's entry). Importing
this package imports no torch: the registry imports `engine` when a path first needs one. Finding weights and
rendering prompts are shared with the other in-process engines (`toolaudit.engines.models`, `.prompting`).
"""
