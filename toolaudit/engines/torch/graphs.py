"""CUDA graphs of the static-shape step: what removes the host from a GPU decode loop.

A 30-layer model's step is ~300 kernel launches; at batch 1 on a GPU each takes longer to launch than to run, so
an eager loop is host-bound (152 tokens/s for SmolLM2-135M on an H100, measured, where the weights' memory traffic
allows ~12,000). A `torch.cuda.CUDAGraph` records the launches of one `StaticKV.forward` per shape (batch-size
bucket x width) once and replays them with one call. Everything a graph reads is static: the id and position
inputs are copied into the graph's own tensors before each replay, the KV buffers never move (growing them
clears the graphs), and tensors made during capture (row indices, the mask, the logits) live in the graphs'
shared memory pool. Capture runs the same `forward` that eager fixed-shape steps run: same kernels, same shapes,
same tokens (`pytest -m gpu` checks graphs == no graphs).

Chosen over `torch.compile(mode="reduce-overhead")`: the same CUDA graphs without minutes of compilation per
shape and without recompiling on every new bucket; the engine's attention stays the reference kernel.
This module only runs on CUDA devices; on CPU steps run eagerly (`StaticKV` without graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [slots, width] static input
    positions: torch.Tensor  # [slots, width] static input (also the columns written)
    logits: torch.Tensor  # [slots, width, vocab] static output


class StepGraphs:
    """Captured fixed-shape steps of one `StaticKV`'s buffers, keyed by (slots, width), sharing one memory pool."""

    def __init__(self, warmup: int = 2):
        self.warmup = warmup
        self._captured: dict[tuple[int, int], _Captured] = {}
        self._pool = None
        self.captures = self.replays = 0

    def clear(self) -> None:
        """Forget every graph (the buffers they write moved)."""
        self._captured.clear()

    def step(self, kv, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`kv.forward(ids, positions, capacity)` by graph replay: logits [slots, width, vocab] (the graph's output
        tensor, valid until the next replay of the same shape)."""
        key = (ids.shape[0], ids.shape[1])
        with torch.cuda.device(kv.device):  # capture and replay on the buffers' device, not the current one
            captured = self._captured.get(key)
            if captured is None:
                captured = self._captured[key] = self._capture(kv, *key)
            captured.ids.copy_(ids)
            captured.positions.copy_(positions)
            captured.graph.replay()
        self.replays += 1
        return captured.logits

    def _capture(self, kv, slots: int, width: int) -> _Captured:
        """Warm up on a side stream (lazy initialisation, cuBLAS workspaces), then record one forward pass.
        Warm-up and capture write their keys into the buffers' scratch column (the last), which no mask shows."""
        device = kv.device
        ids = torch.zeros(slots, width, dtype=torch.long, device=device)
        positions = torch.full((slots, width), kv.cache.capacity - 1, dtype=torch.long, device=device)
        span = kv.cache.capacity
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                kv.forward(ids, positions, span)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = kv.forward(ids, positions, span)
        self.captures += 1
        return _Captured(graph, ids, positions, logits)
