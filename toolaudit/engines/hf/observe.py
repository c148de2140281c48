"""What `generate()` does not report and the hf engine needs: where each row finished and when each step ended
(`Recorder`, a stopping criterion), and how many proposals speculation verified (`DraftCounter`)."""

from __future__ import annotations

import time

import torch
from transformers import StoppingCriteria, StopStringCriteria


class Recorder(StoppingCriteria):
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
