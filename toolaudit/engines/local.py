"""The skeleton of in-process engines (torch, hf, vllm): what each did its own way before, written once.

- load once: `load()` sets the path's process-wide state (`_enter`: torch's thread count), then `_load()`;
  `close()` calls `_release()`; the model and tokenizer are `_model` / `_tokenizer` while loaded.
- generate: a path that cannot load fails every request as rows; each request is rendered (`prompting.render`,
  the model's own tokenizer: identical prompt tokens on every engine) and checked against the context limit,
  a failure becoming that request's row; the rest decode in groups (`_groups`, `_decode`), and a group that
  fails as a whole is retried request by request, so only the culprit fails (at batch size 1: a different
  numerical path, but rows instead of a crash). An exception that means the engine itself is gone (`_lost`)
  fails the group instead.
- text: prefill + decoded tokens, cut after the stop string or where a prefilled call's JSON closes
  (`completion.cut_after_stop`), on every engine; its finish reason follows the cut (`_finish`).
- fingerprint pieces every engine words the same way: weights, draft, dtype, speculative settings.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

from .base import Engine, EngineRequest, EngineResult, error_result
from .completion import cut_after_stop, use_torch_threads, value_closed
from .models import model_identity, resolve
from .prompting import render
from .threads import available_cores, choose


@dataclass(frozen=True)
class Prompt:
    """A request ready to decode: its prompt token ids and the prefill its text starts with. `chat` is what an
    engine that renders prompts itself receives instead (vLLM's chat template), with `ids` empty."""

    ids: list[int]
    prefill: str
    chat: Any = None


class LocalEngine(Engine):
    """An engine whose model runs in this process behind a Hugging Face tokenizer."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self._model: Any = None
        self._tokenizer: Any = None
        self._pieces: dict[int, str] = {}  # token id -> text (`_piece`)

    # -- lifecycle ----------------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        """Threads this path computes with: its `threads` key, else $OMP_NUM_THREADS, else the cores the process
        may use that other processes leave free (`threads.choose`, measured again after 10 s)."""
        return choose(self.options.threads).threads

    @property
    def threads_identity(self) -> int:
        """The thread count the fingerprint names: the configured one, else the cores the process may use (what
        fingerprints named before the count followed the load). Not the count in use: that follows momentary
        load, and the same calls decode to the same tokens on 1 and 2 threads (tests/engines/test_threads.py), so a
        resumed or sharded run on a busier machine stays the same path."""
        return self.options.threads or available_cores()

    def _enter(self) -> None:
        """Process-wide state this path needs before it loads or decodes: torch's thread count is global and
        paths may differ, so it is set each time."""
        use_torch_threads(self.threads)

    def load(self) -> None:
        if not self.loaded:
            self._enter()
            super().load()

    def check(self) -> None:
        """The model (and draft) specs resolve to weights on this machine; nothing loads."""
        resolve(self.path.model)
        spec = self.path.speculative
        if spec is not None and spec.model:
            resolve(spec.model)

    @property
    def model(self) -> Any:
        """What decodes (a transformers model; the `vllm.LLM` for vllm), loading it on first use."""
        self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (loading the path if it has none yet)."""
        if self._tokenizer is None:
            self.load()
        return self._tokenizer

    def decode_tokens(self, ids: list[int], keep_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not keep_special)

    # -- generation ---------------------------------------------------------------------------------------
    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order; see the module docstring for how failures become rows."""
        try:
            self.load()
        except Exception as exc:  # a path that cannot load fails every request, as rows, not as a crash
            return [error_result(r.key, exc) for r in requests]
        self._enter()
        results: list[EngineResult | None] = [None] * len(requests)
        ready: list[tuple[int, Prompt]] = []
        for i, req in enumerate(requests):
            try:
                ready.append((i, self._prepare(req)))
            except Exception as exc:
                results[i] = error_result(req.key, exc)
        for group in self._groups(ready):
            outcome = self._run([requests[i] for i, _ in group], [prompt for _, prompt in group])
            for (i, _), result in zip(group, outcome):
                results[i] = result
        return results  # type: ignore[return-value]

    def _prepare(self, req: EngineRequest) -> Prompt:
        """Render and tokenize one request; too long for the model, or empty, fails that request."""
        p = self.path
        rendered = render(self._tokenizer, req.messages, req.tools, p.prompt)
        ids = self._tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("the rendered prompt has no tokens")
        limit = self._context_limit()
        if limit is not None and len(ids) + p.max_tokens > limit[0]:
            raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {p.max_tokens} exceeds {limit[1]}")
        return Prompt(ids, rendered.prefill)

    def _context_limit(self) -> tuple[int, str] | None:
        """The most positions prompt plus completion may take, and its name in an error; None: no limit known."""
        return None

    def _groups(self, ready: list[tuple[int, Prompt]]) -> list[list[tuple[int, Prompt]]]:
        """How prepared requests reach `_decode`: all together by default (the engine batches them), in
        request order (a session's calls extend each other's prompts, so prefixes get reused)."""
        return [ready] if ready else []

    def _run(self, requests: list[EngineRequest], prompts: list[Prompt]) -> list[EngineResult]:
        try:
            return self._decode(requests, prompts)
        except Exception as exc:
            if self._lost(exc) or len(requests) == 1:
                return [error_result(r.key, exc) for r in requests]
            return [self._run([r], [p])[0] for r, p in zip(requests, prompts)]

    def _lost(self, exc: Exception) -> bool:
        """Whether `exc` means the engine itself is gone (it then closes itself; the next call loads again)."""
        return False

    @abstractmethod
    def _decode(self, requests: list[EngineRequest], prompts: list[Prompt]) -> list[EngineResult]:
        """Decode one group; may raise (the whole group then retries request by request)."""

    def _text(self, prefill: str, token_ids: list[int]) -> str:
        """The completion's text as every engine builds it: prefill + decoded tokens, cut after the stop string."""
        text = prefill + self._tokenizer.decode(token_ids, skip_special_tokens=True)
        return cut_after_stop(text, len(prefill), self.path.stop_strings, self.path.value_end)

    def _piece(self, token: int) -> str:
        """Token id -> text, memoized: stop strings and a call's end are checked per token without decoding
        whole outputs."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._tokenizer.decode([token])
        return piece

    def _finish(self, text: str, prefill: str, reason: str | None) -> str | None:
        """The engine's finish reason, except that an answer whose JSON value closed (`PathConfig.value_end`)
        ended there: "stop", also where the engine decoded on past it to max_tokens (the text is cut there)."""
        if reason == "length" and self.path.value_end and value_closed(text, len(prefill)):
            return "stop"
        return reason

    # -- identity -----------------------------------------------------------------------------------------
    def _weights(self) -> dict[str, Any]:
        """The fingerprint's weights: model spec and content hashes of its weights and the draft's, dtype."""
        p = self.path
        spec = p.speculative
        return {"model": p.model, "model_identity": model_identity(p.model),
                "draft_identity": model_identity(spec.model) if spec and spec.model else None, "dtype": p.dtype}

    def _speculative(self, *fields: str) -> dict[str, Any] | None:
        """The path's speculative settings as the fingerprint names them (the fields this engine uses)."""
        spec = self.path.speculative
        if spec is None:
            return None
        values = asdict(spec)
        return {"method": spec.method, **{f: values[f] for f in fields}}

    def _prompt(self) -> dict[str, Any]:
        return {"few_shot": self.path.prompt.few_shot, "prefill": self.path.prompt.prefill}
