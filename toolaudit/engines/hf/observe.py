"""What `generate()` does not report or do and the hf engine needs: where each row finished and when each step
ended (`Recorder`, a stopping criterion), how many proposals speculation verified (`DraftCounter`), and a draw
per row from the row's own generator (`SeededDraw`, a logits processor)."""

from __future__ import annotations

import time
from typing import Callable

import torch
from transformers import (
    LogitsProcessor,
    StoppingCriteria,
    StopStringCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..completion import ValueEnd

# generate() arguments that sampling reads; SeededDraw applies them itself (the call then runs greedy)
SAMPLING_ARGS = frozenset({"do_sample", "temperature", "top_k", "top_p"})


class Recorder(StoppingCriteria):
    """A stopping criterion that records, per row, where it finished (EOS, or a stop string by transformers'
    `StopStringCriteria`), and when each step ended. It stops rows at stop strings (what `stop_strings=` would
    do); EOS and max_new_tokens also stop them through generate()'s own criteria.

    generate() calls it once per step (once per verification pass with speculation, after several tokens may
    have been appended): every new position is checked, so a finish inside a pass is found at its token.
    """

    def __init__(self, stop: StopStringCriteria | None, eos: list[int], width: int, rows: int, device,
                 piece: Callable[[int], str] | None = None):
        self.stop, self.width = stop, width
        # With `piece` (token id -> text), a row also finishes where the JSON value its answer opens with closes
        # (`completion.ValueEnd`), as the torch engine's rows do.
        self.piece = piece
        self.values = [ValueEnd() for _ in range(rows)] if piece is not None else None
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
            if self.values is not None:
                closed = [self.finish[row] is None and self.values[row].feed(self.piece(int(token))) is not None
                          for row, token in enumerate(input_ids[:, pos - 1].tolist())]
                done = done | torch.tensor(closed, dtype=torch.bool, device=done.device)
            for row in done.nonzero().flatten().tolist():
                if self.finish[row] is None:
                    self.finish[row] = pos - self.width
        self.seen = max(self.seen, length)
        self.calls.append((length, now))
        return torch.tensor([f is not None for f in self.finish], dtype=torch.bool, device=input_ids.device)

    def time_at(self, length: int, default: float) -> float:
        """When the sequence first reached `length` tokens (the end of generate() if it never did)."""
        return next((t for n, t in self.calls if n >= length), default)


class DraftCounter:
    """Counts the proposals verified during one generate() call on `model` (None: counts nothing).

    transformers exposes no drafted-token counter, so this wraps the candidate generator generate() builds
    (`model._get_candidate_generator`, private; shadowed on the instance for the call and restored after):
    each `get_candidates` returns the sequence plus its proposals. Without that method drafted stays 0.
    """

    def __init__(self, model):
        self.model, self.drafted = model, 0

    def __enter__(self) -> DraftCounter:
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


class SeededDraw(LogitsProcessor):
    """Sampling with one `torch.Generator` per row, as the last logits processor of a greedy generate() call:
    transformers draws every row from torch's one global generator, so a row's draws would depend on the rows
    beside it. Applies what `do_sample=True` would (transformers' temperature, top-k and top-p warpers, in its
    order, from the call's `temperature`, `top_k`, `top_p`), draws each row's token from its own generator, and
    returns scores that are -inf except at the drawn token, which greedy decoding then picks.

    `top`/`best` hold, per step, the top-2 and the argmax of the warped scores: what `output_scores` holds when
    sampling (the returned scores are the mask)."""

    def __init__(self, seeds: list[int], kwargs: dict, device):
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        temperature, top_k, top_p = kwargs.get("temperature", 1.0), kwargs.get("top_k", 0), kwargs.get("top_p", 1.0)
        self.warpers: list[LogitsProcessor] = []
        if temperature is not None and temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p is not None and top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))
        self.top: list = []
        self.best: list = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        probs = torch.softmax(scores, dim=-1)
        picks = torch.cat([torch.multinomial(probs[row], 1, generator=g) for row, g in enumerate(self.generators)])
        self.top.append(torch.topk(scores.float(), 2, dim=-1))
        self.best.append(scores.argmax(-1))
        masked = torch.full_like(scores, float("-inf"))
        return masked.scatter_(1, picks[:, None], 0.0)
