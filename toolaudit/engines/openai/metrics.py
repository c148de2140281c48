"""Speculative-decoding counts of an OpenAI-compatible endpoint, read from its Prometheus `/metrics`.

An endpoint's answers carry no draft counts, so a replay through one showed acceptance as "-". vLLM counts them
server-wide as Prometheus counters (vLLM 0.32: `vllm/v1/spec_decode/metrics.py`, `vllm/v1/metrics/loggers.py`,
labels `model_name` and `engine`, plus `finished_reason` on the request counter); `toolaudit serve` writes the
same names:

    vllm:spec_decode_num_draft_tokens_total     draft tokens proposed (drafted_tokens)
    vllm:spec_decode_num_accepted_tokens_total  draft tokens the target kept (accepted_tokens)
    vllm:spec_decode_num_drafts_total           verification steps that had a draft
    vllm:request_success_total                  finished requests (every finish reason)

`ServerCounters` reads them before and after each engine call (`OpenAIEngine.generate`, one chunk of a path's
requests) and puts the differences on that call's results:

- Attribution: over the call's successful results, in proportion to their completion tokens (largest
  remainder, so the sums are exact and no result gets more accepted than drafted tokens). Chunk and path
  figures (`replay_chunks`, `path_performance`, reports: sums) are the server's counts for the call; one
  output's share is an apportionment, not its own count.
- Other traffic: when the server's finished-request counter moved by more than the requests this call sent,
  other clients were served meanwhile and the counts are the server's, not the run's. Said once per path (a
  warning line, which `replay` repeats as a note), and kept in `shared_requests`. (A request retried after a
  timeout that the server finished anyway counts there too: a false alarm on the safe side.)
- Where: `metrics_url`, else the base URL's origin + `/metrics`, tried quietly: a 404, a connection error or a
  page without the counters means "unknown" (acceptance stays "-"), said nowhere; the default is not asked again
  once it failed. An explicit `metrics_url` that fails is warned about once. `metrics_url = false` never asks.
  The path's key and headers go only to the base URL's own origin.
- Fewer requests counted than answered, even after waiting (below): the page is likely one replica's behind a
  load balancer; the counts cover part of the run (said once).
- Cost: two GETs of the page per engine call (a few milliseconds on vLLM), inside the call's wall time.
- Not derived: forward passes (vLLM counts only the steps that drafted), so tokens per pass stays "-".
- vLLM counts a request in the same step of its output loop that hands out the answer, just after it; a read
  that has not yet seen all of the call's answers is repeated (up to `SETTLE_TRIES` times, `SETTLE_S` apart).
- The counters went backwards (the server restarted during the call): that call's counts are unknown (said once).
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from ..base import EngineResult

DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
REQUESTS = "vllm:request_success_total"
WANTED = (DRAFTED, ACCEPTED, DRAFTS, REQUESTS)
READ_TIMEOUT_S = 5.0
SETTLE_TRIES, SETTLE_S = 10, 0.05
MAX_PAGE = 16 << 20  # a /metrics page is a few hundred kB at most


def default_metrics_url(base_url: str) -> str:
    """The base URL's origin + `/metrics` (vLLM serves the API under /v1 and its metrics at the root)."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


def parse(text: str, model: str | None = None) -> dict[str, float]:
    """The wanted counters in a Prometheus text page, each summed over its samples (engines, finish reasons).
    When some sample of a counter is labelled `model_name=model`, only those count (a server of several models).
    Counters absent from the page are absent from the result. ValueError for a page that is not Prometheus text."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in _samples(text):
        if name in WANTED:
            samples.setdefault(name, []).append((labels, value))
    out = {}
    for name, found in samples.items():
        mine = [v for labels, v in found if labels.get("model_name") == model]
        out[name] = float(sum(mine if mine else (v for _, v in found)))
    return out


def _samples(text: str):
    from prometheus_client.parser import text_string_to_metric_families  # a dependency (serve/ writes with it)

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


Reading = dict  # counter name -> value: the wanted counters found on one read of the page


def spread(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (equally when they sum to 0), largest remainder first, ties to
    the earlier: integers that sum to `total`."""
    if not weights:
        return []
    w = [max(x, 0.0) for x in weights]
    if sum(w) <= 0:
        w = [1.0] * len(w)
    exact = [total * x / sum(w) for x in w]
    shares = [int(e) for e in exact]
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    return shares


def cap(accepted: list[int], drafted: list[int]) -> list[int]:
    """`accepted` with no share above its `drafted` one: the surplus moves to shares with room (there is room
    enough when the totals are in order)."""
    out = [min(a, d) for a, d in zip(accepted, drafted)]
    surplus = sum(accepted) - sum(out)
    for i, d in enumerate(drafted):
        room = min(d - out[i], surplus)
        out[i] += room
        surplus -= room
    return out


class ServerCounters:
    """The spec-decode counters of one openai path's server, read around each engine call."""

    def __init__(self, path_name: str, model: str, base_url: str, metrics_url: str | bool | None = None,
                 headers: dict[str, str] | None = None,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)):
        self.path_name, self.model, self.say = path_name, model, say
        self.explicit = isinstance(metrics_url, str)
        self.url = metrics_url if self.explicit else default_metrics_url(base_url)
        self.off = metrics_url is False
        same_origin = default_metrics_url(self.url) == default_metrics_url(base_url)
        self._headers = dict(headers or {}) if same_origin else {}  # credentials only to the API's own origin
        self._worked = False
        self._said: set[str] = set()
        self.shared_requests = 0  # requests other clients sent meanwhile, summed over the calls that saw any

    @property
    def shared(self) -> bool:
        return self.shared_requests > 0

    def read(self) -> Reading | None:
        """The counters now; None when they cannot be read (said once for an explicit URL)."""
        if self.off:
            return None
        try:
            request = urllib.request.Request(self.url, headers={**self._headers, "Accept": "text/plain"})
            with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:
                reading = parse(response.read(MAX_PAGE).decode("utf-8", "replace"), self.model)
        except urllib.error.HTTPError as exc:
            return self._failed(f"HTTP {exc.code}")
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets; a page that is not Prometheus text
            reason = getattr(exc, "reason", None) or exc
            return self._failed(f"{type(exc).__name__}: {reason}"[:200])
        if self.explicit and not reading:  # (a vLLM without speculation has the request counter, not the others)
            self._once("nothing", f"metrics_url {self.url} holds none of vLLM's counters ({DRAFTED}, {REQUESTS}); "
                                  f"acceptance unknown")
        self._worked = True
        return reading

    def _failed(self, reason: str) -> None:
        if self.explicit:
            self._once("read", f"metrics_url {self.url} could not be read ({reason}); acceptance unknown")
        elif not self._worked:
            self.off = True  # the default is tried quietly, once
        return None

    def _once(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            self.say(f"toolaudit: warning: paths.{self.path_name}: {message}")

    def attribute(self, before: Reading | None, sent: int, results: list[EngineResult]) -> None:
        """Put the counters' movement since `before` on `results` (the call that sent `sent` requests)."""
        if before is None or before.get(DRAFTED) is None:
            return
        ok = [r for r in results if r.ok]
        after = self.read()
        for _ in range(SETTLE_TRIES):  # until the request counter has seen every answer of the call
            counted = _moved(before, after, REQUESTS) if after is not None else None
            if counted is None or counted >= len(ok):
                break
            time.sleep(SETTLE_S)
            after = self.read() or after
        if after is None or after.get(DRAFTED) is None:
            return
        drafted, accepted = _moved(before, after, DRAFTED), _moved(before, after, ACCEPTED)
        requests = _moved(before, after, REQUESTS)
        if drafted < 0 or (accepted is not None and accepted < 0) or (requests is not None and requests < 0):
            self._once("reset", f"the server's counters at {self.url} went backwards (a restart?): acceptance "
                                f"unknown for the requests served meanwhile")
            return
        if requests is not None and requests > sent:
            self.shared_requests += int(requests - sent)
            self._once("shared", f"other traffic shared the server during the replay ({int(requests - sent)} "
                                 f"requests beyond the replay's {sent} in one engine call): the acceptance counts "
                                 f"read from {self.url} are the server's, not the run's")
        if requests is not None and requests < len(ok):
            self._once("partial", f"the server at {self.url} counted {int(requests)} of the {len(ok)} requests it "
                                  f"answered in one engine call: its /metrics may be one replica's of several behind "
                                  f"a load balancer, so the acceptance counts cover part of the run only")
        if not ok or not drafted:
            return
        weights = [r.completion_tokens for r in ok]
        drafted_shares = spread(int(round(drafted)), weights)
        accepted_total = min(int(round(accepted or 0)), int(round(drafted)))
        accepted_shares = cap(spread(accepted_total, weights), drafted_shares)
        for r, d, a in zip(ok, drafted_shares, accepted_shares):
            r.drafted_tokens += d
            r.accepted_tokens += a


def _moved(before: Reading, after: Reading, name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    if a is None:
        return None
    return a - (b or 0.0)
