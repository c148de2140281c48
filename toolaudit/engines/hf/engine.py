"""`HFEngine`: one decode path on Hugging Face `model.generate()`, called the way offline eval harnesses call it.

Per request (`batch = "per_prompt"`, the default) or per left-padded batch (`"padded"`):
`model.generate(input_ids, attention_mask, max_new_tokens=path.max_tokens, do_sample=temperature > 0, ...)`
with the in-process engines' prompt rendering (`toolaudit.engines.prompting.render`, same tokenizer: identical
prompt tokens on hf, torch and vLLM paths). Sampling passes the path's `top_k` and `top_p` (defaults 0 and 1.0:
`temperature` alone shapes the distribution, as on the other engines; transformers' own default is top_k=50, set
it in `generate_args` to match a harness) and makes each request the draw of its own seed, the torch engine's
`row_seed(path.seed, key, sample)`, whatever batch it is in:
- `batch = "per_prompt"`: torch's global generator is seeded with it before the request's generate() call
  (sample 0 draws what every sampled hf path drew before samples existed).
- `batch = "padded"`: one global generator cannot give each row its own draws, so a padded batch is decoded
  by generate()'s greedy loop with a last logits processor (`SeededDraw`) that applies the warpers sampling
  would (temperature, top-k, top-p: transformers' own classes, in its order) and draws each row's token from
  the row's own `torch.Generator`, masking every other token: the argmax is the draw. A row's draws are then
  those it gets decoded alone, the padded numerics aside. The N samples of a call are N rows of the batch;
  `num_return_sequences` is not used: it draws every row from one generator, so sample i would depend on N
  and on the other samples' draws. Margins are taken from the warped scores, as sampled generate() keeps them.
Speculation: `speculative.method = "ngram"` ->
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
string exactly as every in-process engine cuts it (`LocalEngine._text`).

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
from transformers import LogitsProcessorList, StoppingCriteriaList, StopStringCriteria

from toolaudit import ConfigError

from ..base import EngineRequest, EngineResult
from ..completion import row_seed
from ..devices import device_name
from ..local import LocalEngine, Prompt
from ..models import check_draft_compatible, converted_dir, eos_ids, max_positions, resolve
from ..paths import PathConfig
from .config import CAPABILITIES, ENGINE, check_path
from .observe import SAMPLING_ARGS, DraftCounter, Recorder, SeededDraw

# Models loaded for hf paths (stock attention), shared by hf paths on the same (spec, dtype, device, attention)
# and freed when the last engine holding them closes or is collected. attention = "toolaudit" uses the torch
# engine's model, which that engine keeps for the process.
_models: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}
_users: dict[tuple[str, str, str, str], set[int]] = {}
_lock = threading.Lock()


def load_hf_model(spec: str, dtype: str, device: str, attention: str,
                  user: int | None = None) -> tuple[Any, Any, tuple]:
    """(model, tokenizer, cache key): a model loaded from the converted weights (`models.converted_dir`) with
    transformers' `attention`, held for `user` (an engine's id) until `_let_model_go(key, user)`."""
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


def _let_model_go(key: tuple, user: int) -> None:
    with _lock:
        users = _users.get(key)
        if users is None:
            return
        users.discard(user)
        if not users:
            del _models[key], _users[key]


class HFEngine(LocalEngine):
    """One decode path on `model.generate()`. Models load on first use; `close()` lets them go."""

    name = "hf"
    capabilities = CAPABILITIES

    def __init__(self, path):
        super().__init__(path)
        check_path(path)
        self.options = ENGINE.read(path.options)  # HFOptions: the path's keys, typed
        self._draft = None
        self._stop: StopStringCriteria | None = None
        self._eos: list[int] = []
        self._pad = 0
        self._positions: int | None = None
        self._held: list[weakref.finalize] = []  # releases of the shared models this engine holds

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        """Load (or share) the model, and the draft for draft_model speculation; check they are compatible."""
        p = self.path
        if p.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"paths.{p.name}: device {p.device!r} but CUDA is not available")
        attention = self.options.attention
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
        self._eos, self._positions = eos_ids(model, tokenizer), max_positions(model)
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self._eos or [0])[0]
        self._stop = StopStringCriteria(tokenizer, list(p.stop_strings)) if p.stop_strings else None
        self._model, self._tokenizer = model, tokenizer

    def _acquire(self, spec: str, attention: str) -> tuple[Any, Any]:
        if attention == "toolaudit":
            return self._torch_engine_model(spec)
        model, tokenizer, key = load_hf_model(spec, self.path.dtype, self.path.device, attention, id(self))
        # released by close(), or when this engine is collected without one
        self._held.append(weakref.finalize(self, _let_model_go, key, id(self)))
        return model, tokenizer

    def _torch_engine_model(self, spec: str) -> tuple[Any, Any]:
        """attention = "toolaudit": the torch engine's own model for `spec` (its grouped attention, native
        numerics), asked of that engine through the registry, so both engines share one weights object."""
        from .. import make_engine

        p = self.path
        torch_path = PathConfig(name=p.name, engine="torch", model=spec, dtype=p.dtype, device=p.device,
                                options={"numerics": "native", "threads": self.threads})
        engine = make_engine(torch_path)
        return engine.model, engine.tokenizer

    def _let_go(self) -> None:
        for release in self._held:
            release()
        self._held = []
        self._model = self._tokenizer = self._draft = self._stop = None

    def _release(self) -> None:
        """Drop this path's models (freed once no other hf path holds them); the next `generate` loads again."""
        self._let_go()
        gc.collect()
        if self.path.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ generation

    def generate_kwargs(self) -> dict[str, Any]:
        """The generate() arguments the path decides (besides inputs, EOS/pad ids and stopping criteria)."""
        p, spec = self.path, self.path.speculative
        kwargs: dict[str, Any] = {"max_new_tokens": p.max_tokens, "do_sample": p.temperature > 0,
                                  "output_scores": True, "return_dict_in_generate": True}
        if p.temperature > 0:
            kwargs.update(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p)
        if spec is not None and spec.method == "ngram":
            kwargs.update(prompt_lookup_num_tokens=spec.num_speculative_tokens,
                          max_matching_ngram_size=spec.prompt_lookup_max)
        kwargs.update(self.options.generate_args)
        return kwargs

    def assistant_settings(self) -> dict[str, Any] | None:
        """The draft's generation-config fields that drive transformers' assisted generation (None: no draft)."""
        spec = self.path.speculative
        if spec is None or spec.method != "draft_model":
            return None
        return {"num_assistant_tokens": spec.num_speculative_tokens,
                "num_assistant_tokens_schedule": self.options.num_assistant_tokens_schedule,
                "assistant_confidence_threshold": self.options.assistant_confidence_threshold}

    def _context_limit(self) -> tuple[int, str] | None:
        return (self._positions, f"the model's {self._positions} positions") if self._positions else None

    def _groups(self, ready: list[tuple[int, Prompt]]) -> list[list[tuple[int, Prompt]]]:
        """One generate() per prompt, or per left-padded batch of `batch_size` (`batch = "padded"`)."""
        size = self.path.batch_size if self.options.batch == "padded" else 1
        return [ready[start:start + size] for start in range(0, len(ready), size)]

    def _decode(self, requests: list[EngineRequest], prompts: list[Prompt]) -> list[EngineResult]:
        p, model = self.path, self._model
        device = model.device
        width = max(len(prompt.ids) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every row's last prompt token is at width - 1
            input_ids[row, width - len(prompt.ids):] = torch.tensor(prompt.ids, dtype=torch.long)
            attention_mask[row, width - len(prompt.ids):] = 1
        recorder = Recorder(self._stop, self._eos, width, len(prompts), device,
                            self._piece if p.value_end else None)
        kwargs = {**self.generate_kwargs(), "input_ids": input_ids.to(device),
                  "attention_mask": attention_mask.to(device), "eos_token_id": self._eos,
                  "pad_token_id": self._pad, "stopping_criteria": StoppingCriteriaList([recorder])}
        assistant = self.assistant_settings()
        if assistant is not None:
            for name, value in assistant.items():  # reset per call: a heuristic schedule would carry over
                setattr(self._draft.generation_config, name, value)
            kwargs["assistant_model"] = self._draft
        draw = None
        if p.temperature > 0 and self.options.batch == "padded":
            draw = SeededDraw([row_seed(p.seed, r.key, r.sample) for r in requests], kwargs, device)
            kwargs = {k: v for k, v in kwargs.items() if k not in SAMPLING_ARGS}
            kwargs.update(do_sample=False, output_scores=False,
                          logits_processor=LogitsProcessorList([*(kwargs.get("logits_processor") or ()), draw]))
        elif p.temperature > 0:  # per_prompt: one request per call
            torch.manual_seed(row_seed(p.seed, requests[0].key, requests[0].sample))
        counter = DraftCounter(model if p.speculative is not None else None)
        start = time.perf_counter()
        with torch.inference_mode(), counter:
            out = model.generate(**kwargs)
        end = time.perf_counter()

        sequences = out.sequences[:, width:].tolist()
        if draw is not None:
            top, best = draw.top, draw.best
        else:
            top = [torch.topk(s.float(), 2, dim=-1) for s in out.scores]  # per step: [rows, 2]
            best = [s.argmax(-1) for s in out.scores]  # argmax, not topk order: ties go to the lowest id, as chosen
        speculative = p.speculative is not None
        tops = top_logprobs(out.scores, max(r.logprobs for r in requests))
        results = []
        for row, (req, prompt) in enumerate(zip(requests, prompts)):
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
            text = self._text(prompt.prefill, token_ids)
            results.append(EngineResult(
                key=req.key, text=text, token_ids=token_ids,
                prompt_tokens=len(prompt.ids), completion_tokens=len(token_ids),
                latency_s=recorder.time_at(width + n, end) - start,
                ttft_s=(recorder.calls[0][1] if recorder.calls else end) - start,
                drafted_tokens=counter.drafted if speculative else 0,
                accepted_tokens=max(0, len(generated) - passes) if speculative else 0,
                forward_passes=passes, margins=margins, top2=top2,
                finish_reason=self._finish(text, prompt.prefill, "stop" if finished is not None else "length"),
                top_logprobs=[step[row][:req.logprobs] for step in tops[:n]] if req.logprobs else [],
            ))
        return results

    # ------------------------------------------------------------------ identity

    def path_components(self) -> dict[str, Any]:
        """What defines this path: versions, weights (and draft), dtype, device, attention, how prompts are
        batched, the generate() arguments, stop strings, prompt rendering and threads. Loads no model."""
        import transformers

        p, o = self.path, self.options
        return {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            **self._weights(),
            "device": device_name(p.device),
            "attention": o.attention,
            "batch": o.batch,
            "batch_size": p.batch_size if o.batch == "padded" else 1,
            "generate_kwargs": self.generate_kwargs(),
            "assistant": self.assistant_settings(),
            "speculative": self._speculative("num_speculative_tokens", "prompt_lookup_max", "model"),
            "sampling": {"temperature": p.temperature, "seed": p.seed, **p.end_components(),
                         **p.sampling_components()},
            "prompt": self._prompt(),
            "torch_threads": self.threads_identity,
        }


def top_logprobs(scores, k: int) -> list[list[list[tuple[int, float]]]]:
    """Per step, per row: the top-k (token id, log-probability) pairs of generate()'s `scores` (log_softmax in
    float32); nothing when k is 0 (requests that did not ask pay nothing)."""
    if k <= 0:
        return []
    out = []
    for step in scores:
        top = torch.topk(torch.log_softmax(step.float(), dim=-1), min(k, step.shape[-1]), dim=-1)
        out.append([list(zip(ids, values)) for ids, values in zip(top.indices.tolist(), top.values.double().tolist())])
    return out
