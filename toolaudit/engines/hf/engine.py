"""`HFEngine`: one decode path on Hugging Face `model.generate()`, called the way offline eval harnesses call it.

Per request (`batch = "per_prompt"`, the default) or per left-padded batch (`"padded"`):
`model.generate(input_ids, attention_mask, max_new_tokens=path.max_tokens, do_sample=temperature > 0, ...)`
with the torch engine's prompt rendering (`torch.prompting.render`, same tokenizer: identical prompt tokens on
hf, torch and vLLM paths). Sampling seeds torch's global generator per call with the torch engine's per-request
seed (`row_seed(path.seed, key)`; a padded batch takes its first request's) and passes `top_k=0, top_p=1.0`,
so `temperature` alone shapes the distribution, as on the other engines (transformers' own default is
top_k=50; set it in `generate_args` to match a harness). Speculation: `speculative.method = "ngram"` ->
`prompt_lookup_num_tokens=k, max_matching_ngram_size=prompt_lookup_max`; `"draft_model"` -> `assistant_model`
with the draft's `num_assistant_tokens=k` (schedule and confidence threshold from the path's keys).

Stop strings: `generate(stop_strings=..., tokenizer=...)` builds transformers' `StopStringCriteria` on every
call (it walks the whole vocabulary: ~1 s for SmolLM2) and copies `stop_strings` into a draft's generation
config (whose generate() then fails without a tokenizer). This engine builds the same `StopStringCriteria`
once per path and passes it in `stopping_criteria`: the same matching, once. EOS ids are the tokenizer's plus
the model generation config's (as the torch engine). transformers matches stop strings against the whole
sequence, so a stop string can complete across the end of the prompt (e.g. a prefill ending in "\n" and a
stop of "\n\n"); the torch engine matches generated text only. Assisted generation can accept tokens past a
stop string in one verification pass (transformers only crops at EOS and max length); token ids are cut after
the token that completed the stop (or EOS), as the torch engine stops there, and `text` is cut after the stop
string exactly as `TorchEngine` cuts it.

Evidence and counters per request:
- `margins`/`top2`: top-1 minus top-2 of each step's `scores` (`output_scores=True,
  return_dict_in_generate=True`): the processed logits that chose the token (raw logits when greedy with no
  logits processors), float32 as generate() computes them.
- `forward_passes`: target forward passes the request took part in, prefill included: its generated tokens
  (one step each, until it finished) without speculation; the verification passes with it (one per
  stopping-criteria call, the first also prefilling).
- `drafted_tokens`: proposals verified, counted by wrapping the candidate generator that generate() builds
  (`_get_candidate_generator`, a private method: transformers exposes no counter; where the method is missing,
  drafted stays 0). `accepted_tokens`: tokens generate() appended minus verification passes (each pass appends
  its accepted proposals plus one token of the target's own), counted like the torch engine, i.e. including
  proposals accepted past a stop string in the last pass.
- `ttft_s`/`latency_s`: from the start of the generate() call to the first step's end / the step that
  finished the request.

A request whose generate() raises becomes an error result; a padded batch that fails is retried one prompt at
a time (at batch 1: a different numerical path, but rows instead of a crash).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

from toolaudit import ConfigError

from ..base import EngineRequest, EngineResult, error_result
from ..completion import available_cores, cut_after_stop, row_seed, use_torch_threads
from ..torch.engine import device_name
from ..torch.models import converted_dir, load_model, model_identity, resolve
from ..torch.prompting import render
from ..torch.proposers import check_draft_compatible
from .config import check_path, options_of

# Models loaded for hf paths (stock attention), shared by hf paths on the same (spec, dtype, device, attention)
# and freed when the last engine holding them closes or is collected. attention = "toolaudit" uses the torch
# engine's cache (`torch.models.load_model`), which keeps its models for the process.
_models: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}
_users: dict[tuple[str, str, str, str], set[int]] = {}
_lock = threading.Lock()


def load_hf_model(spec: str, dtype: str, device: str, attention: str,
                  user: int | None = None) -> tuple[Any, Any, tuple | None]:
    """(model, tokenizer, cache key or None): the torch engine's shared model for "toolaudit" attention, else a
    copy loaded from the same weights (`torch.models.converted_dir`) with transformers' `attention`, held for
    `user` (an engine's id) until `_release(key, user)`."""
    if attention == "toolaudit":
        model, tokenizer = load_model(spec, dtype, device)
        return model, tokenizer, None
    key = (spec, dtype, device, attention)
    with _lock:
        if key not in _models:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            directory = converted_dir(resolve(spec))
            try:
                tokenizer = AutoTokenizer.from_pretrained(directory)
                model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype),
                                                             attn_implementation=attention)
            except OSError as exc:
                raise ConfigError(f"model {spec!r}: cannot load from {directory}: {exc}") from None
            model.to(device)
            model.eval()
            model.requires_grad_(False)
            _models[key] = (model, tokenizer)
            _users[key] = set()
        if user is not None:
            _users[key].add(user)
        model, tokenizer = _models[key]
        return model, tokenizer, key


def _release(key: tuple, user: int) -> None:
    with _lock:
        users = _users.get(key)
        if users is None:
            return
        users.discard(user)
        if not users:
            del _models[key], _users[key]


class HFEngine:
    """One decode path on `model.generate()`. Models load on first use; `close()` lets them go."""

    def __init__(self, path):
        if path.engine != "hf":
            raise ConfigError(f"paths.{path.name}: engine {path.engine!r} is not the hf engine")
        check_path(path)
        self.path = path
        self.options = options_of(path.options)
        self._model = self._tokenizer = self._draft = None
        self._held: list[weakref.finalize] = []  # one per cached model held: releases it once
        self._eos: list[int] = []
        self._pad: int | None = None
        self._stop: StopStringCriteria | None = None

    @property
    def threads(self) -> int:
        """torch threads while this path runs: the `threads` key, else every core the process may use."""
        return self.options["threads"] or available_cores()

    def _use_threads(self) -> None:
        use_torch_threads(self.threads)

    # ------------------------------------------------------------------ loading

    def load(self) -> None:
        """Load (or reuse) the model and, for draft_model speculation, the assistant; check they are compatible."""
        if self._model is not None:
            return
        p = self.path
        if p.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"paths.{p.name}: device {p.device!r} but CUDA is not available")
        self._use_threads()
        attention = self.options["attention"]
        try:
            model, tokenizer = self._acquire(p.model, attention)
            if p.speculative is not None and p.speculative.method == "draft_model":
                draft, draft_tokenizer = self._acquire(p.speculative.model, attention)
                try:
                    check_draft_compatible(model.config.vocab_size, draft.config.vocab_size, tokenizer,
                                           draft_tokenizer)
                except ConfigError as exc:
                    raise ConfigError(f"paths.{p.name}: {exc}") from None
                self._draft = draft
        except BaseException:
            self._let_go()
            raise
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
        self._eos = sorted(i for i in eos if i is not None)
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self._eos or [0])[0]
        self._stop = StopStringCriteria(tokenizer, list(p.stop_strings)) if p.stop_strings else None
        self._model, self._tokenizer = model, tokenizer

    def _acquire(self, spec: str, attention: str) -> tuple[Any, Any]:
        model, tokenizer, key = load_hf_model(spec, self.path.dtype, self.path.device, attention, id(self))
        if key is not None:  # released by close(), or when this engine is collected without one
            self._held.append(weakref.finalize(self, _release, key, id(self)))
        return model, tokenizer

    def _let_go(self) -> None:
        for release in self._held:
            release()
        self._held = []
        self._model = self._tokenizer = self._draft = self._stop = None

    def close(self) -> None:
        """Drop this path's models (freed once no other hf path holds them); the next `generate` loads again."""
        loaded = self._model is not None
        self._let_go()
        if loaded:
            gc.collect()
            if self.path.device.startswith("cuda") and torch.cuda.is_available():
                torch.cuda.empty_cache()

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self) -> Any:
        self.load()
        return self._tokenizer

    def tokenizer_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ generation

    def generate_kwargs(self) -> dict[str, Any]:
        """The generate() arguments the path decides (besides inputs, EOS/pad ids and stopping criteria)."""
        p, spec = self.path, self.path.speculative
        kwargs: dict[str, Any] = {"max_new_tokens": p.max_tokens, "do_sample": p.temperature > 0,
                                  "output_scores": True, "return_dict_in_generate": True}
        if p.temperature > 0:
            kwargs.update(temperature=p.temperature, top_k=0, top_p=1.0)
        if spec is not None and spec.method == "ngram":
            kwargs.update(prompt_lookup_num_tokens=spec.num_speculative_tokens,
                          max_matching_ngram_size=spec.prompt_lookup_max)
        kwargs.update(self.options["generate_args"])
        return kwargs

    def assistant_settings(self) -> dict[str, Any] | None:
        """The draft's generation-config fields that drive transformers' assisted generation (None: no draft)."""
        spec = self.path.speculative
        if spec is None or spec.method != "draft_model":
            return None
        return {"num_assistant_tokens": spec.num_speculative_tokens,
                "num_assistant_tokens_schedule": self.options["num_assistant_tokens_schedule"],
                "assistant_confidence_threshold": self.options["assistant_confidence_threshold"]}

    def generate(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """One result per request, in order: one generate() per prompt, or per padded batch of `batch_size`."""
        try:
            self.load()
        except Exception as exc:  # a path that cannot load fails every request, as rows, not as a crash
            return [error_result(r.key, exc) for r in requests]
        self._use_threads()
        results: list[EngineResult | None] = [None] * len(requests)
        ready: list[tuple[int, list[int], str]] = []
        limit = getattr(self._model.config, "max_position_embeddings", None)
        for i, req in enumerate(requests):
            try:
                rendered = render(self._tokenizer, req.messages, req.tools, self.path.prompt)
                ids = self._tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
                if not ids:
                    raise ValueError("the rendered prompt has no tokens")
                if limit and len(ids) + self.path.max_tokens > limit:
                    raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {self.path.max_tokens} exceeds "
                                     f"the model's {limit} positions")
                ready.append((i, ids, rendered.prefill))
            except Exception as exc:
                results[i] = error_result(req.key, exc)
        size = self.path.batch_size if self.options["batch"] == "padded" else 1
        for start in range(0, len(ready), size):
            group = ready[start:start + size]
            outcome = self._run([requests[i] for i, _, _ in group], [(ids, prefill) for _, ids, prefill in group])
            for (i, _, _), result in zip(group, outcome):
                results[i] = result
        return results  # type: ignore[return-value]

    def _run(self, requests: list[EngineRequest], prompts: list[tuple[list[int], str]]) -> list[EngineResult]:
        """Generate for one batch; if it fails as a whole, retry its prompts one by one so only the culprit fails."""
        try:
            return self._generate(requests, prompts)
        except Exception as exc:
            if len(requests) == 1:
                return [error_result(requests[0].key, exc)]
            return [self._run([r], [p])[0] for r, p in zip(requests, prompts)]

    def _generate(self, requests: list[EngineRequest], prompts: list[tuple[list[int], str]]) -> list[EngineResult]:
        p, model = self.path, self._model
        device = model.device
        width = max(len(ids) for ids, _ in prompts)
        input_ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (ids, _) in enumerate(prompts):  # left padding: every row's last prompt token is at width - 1
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids):] = 1
        recorder = _Recorder(self._stop, self._eos, width, len(prompts), device)
        kwargs = {**self.generate_kwargs(), "input_ids": input_ids.to(device),
                  "attention_mask": attention_mask.to(device), "eos_token_id": self._eos,
                  "pad_token_id": self._pad, "stopping_criteria": StoppingCriteriaList([recorder])}
        assistant = self.assistant_settings()
        if assistant is not None:
            for name, value in assistant.items():  # reset per call: a heuristic schedule would carry over
                setattr(self._draft.generation_config, name, value)
            kwargs["assistant_model"] = self._draft
        if p.temperature > 0:
            torch.manual_seed(row_seed(p.seed, requests[0].key))
        counter = _DraftCounter(model if p.speculative is not None else None)
        start = time.perf_counter()
        with torch.inference_mode(), counter:
            out = model.generate(**kwargs)
        end = time.perf_counter()

        sequences = out.sequences[:, width:].tolist()
        top = [torch.topk(s.float(), 2, dim=-1) for s in out.scores]  # per step: [rows, 2]
        best = [s.argmax(-1) for s in out.scores]  # argmax, not topk order: ties go to the lowest id, as chosen
        speculative = p.speculative is not None
        results = []
        for row, (req, (ids, prefill)) in enumerate(zip(requests, prompts)):
            generated = sequences[row]
            finished = recorder.finish[row]
            n = finished if finished is not None else min(len(generated), p.max_tokens)
            token_ids = generated[:n]
            margins, top2 = [], []
            for step in range(min(n, len(top))):
                values, indices = top[step].values[row].tolist(), top[step].indices[row].tolist()
                chosen = int(best[step][row])
                margins.append(values[0] - values[1])
                top2.append((chosen, indices[1] if indices[0] == chosen else indices[0]))
            passes = len(recorder.calls) if speculative else n
            text = prefill + self._tokenizer.decode(token_ids, skip_special_tokens=True)
            results.append(EngineResult(
                key=req.key, text=cut_after_stop(text, len(prefill), p.stop_strings), token_ids=token_ids,
                prompt_tokens=len(ids), completion_tokens=len(token_ids),
                latency_s=recorder.time_at(width + n, end) - start,
                ttft_s=(recorder.calls[0][1] if recorder.calls else end) - start,
                drafted_tokens=counter.drafted if speculative else 0,
                accepted_tokens=max(0, len(generated) - passes) if speculative else 0,
                forward_passes=passes, margins=margins, top2=top2,
                finish_reason="stop" if finished is not None else "length",
            ))
        return results

    # ------------------------------------------------------------------ identity

    def fingerprint_components(self) -> dict[str, Any]:
        """What defines this path: versions, weights (and draft), dtype, device, attention, how prompts are
        batched, the generate() arguments, stop strings, prompt rendering and threads. Loads no model."""
        import transformers

        p, o = self.path, self.options
        spec = p.speculative
        return {
            "engine": "hf",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "model": p.model,
            "model_identity": model_identity(p.model),
            "draft_identity": model_identity(spec.model) if spec and spec.model else None,
            "dtype": p.dtype,
            "device": device_name(p.device),
            "attention": o["attention"],
            "batch": o["batch"],
            "batch_size": p.batch_size if o["batch"] == "padded" else 1,
            "generate_kwargs": self.generate_kwargs(),
            "assistant": self.assistant_settings(),
            "speculative": None if spec is None else {
                "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                "prompt_lookup_max": spec.prompt_lookup_max, "model": spec.model,
            },
            "sampling": {"temperature": p.temperature, "seed": p.seed, "stop": list(p.stop_strings)},
            "prompt": {"few_shot": p.prompt.few_shot, "prefill": p.prompt.prefill},
            "torch_threads": self.threads,
        }


class _Recorder(StoppingCriteria):
    """A stopping criterion that records, per row, where it finished (EOS, or a stop string by transformers'
    `StopStringCriteria`), and when each step ended. It stops rows at stop strings (what `stop_strings=` would
    do); EOS and max_new_tokens also stop them through generate()'s own criteria.

    generate() calls it once per step (once per verification pass with speculation, after several tokens may
    have been appended): every new position is checked, so a finish inside a pass is found at its token.
    """

    def __init__(self, stop: StopStringCriteria | None, eos: list[int], width: int, rows: int, device):
        self.stop, self.width = stop, width
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)
        self.finish: list[int | None] = [None] * rows  # generated tokens up to and including the finishing one
        self.seen = width
        self.calls: list[tuple[int, float]] = []  # (sequence length, time) per call

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        now = time.perf_counter()
        length = input_ids.shape[1]
        for pos in range(self.seen + 1, length + 1):
            done = torch.isin(input_ids[:, pos - 1], self.eos)
            if self.stop is not None:
                done = done | self.stop(input_ids[:, :pos], scores).to(done.device)
            for row in done.nonzero().flatten().tolist():
                if self.finish[row] is None:
                    self.finish[row] = pos - self.width
        self.seen = max(self.seen, length)
        self.calls.append((length, now))
        return torch.tensor([f is not None for f in self.finish], dtype=torch.bool, device=input_ids.device)

    def time_at(self, length: int, default: float) -> float:
        """When the sequence first reached `length` tokens (the end of generate() if it never did)."""
        return next((t for n, t in self.calls if n >= length), default)


class _DraftCounter:
    """Counts the proposals verified during one generate() call on `model` (None: counts nothing).

    transformers exposes no drafted-token counter, so this wraps the candidate generator generate() builds
    (`model._get_candidate_generator`, private; shadowed on the instance for the call and restored after):
    each `get_candidates` returns the sequence plus its proposals. Without that method drafted stays 0.
    """

    def __init__(self, model):
        self.model, self.drafted = model, 0

    def __enter__(self) -> _DraftCounter:
        model = self.model
        if model is None or not hasattr(type(model), "_get_candidate_generator"):
            self.model = None
            return self
        original = model._get_candidate_generator
        counter = self

        def candidate_generator(*args, **kwargs):
            generator = original(*args, **kwargs)
            get_candidates = generator.get_candidates

            def counted(input_ids, *a, **kw):
                candidates, logits = get_candidates(input_ids, *a, **kw)
                counter.drafted += int(candidates.shape[1] - input_ids.shape[1])
                return candidates, logits

            generator.get_candidates = counted
            return generator

        object.__setattr__(model, "_get_candidate_generator", candidate_generator)
        return self

    def __exit__(self, *exc) -> None:
        if self.model is not None:
            self.model.__dict__.pop("_get_candidate_generator", None)
