"""Prometheus metrics of `toolaudit serve`, under vLLM's names where both servers count the same thing (spec-decode
counters, finished requests, tokens, queue gauges), so a dashboard or an audit script written for vLLM reads this
server unchanged.

Each app owns a `CollectorRegistry`: two servers in one process (tests, benchmarks) never add up each other's
counts, and nothing lands in prometheus_client's global registry. The text is written here from the registry's
samples rather than by `generate_latest`, which sorts labels: every sample here starts with `model_name`, as
this server has always written it, and clients match on that text.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.utils import floatToGoString

from toolaudit.engines.base import EngineResult


class Metrics:
    """The served path's counters and gauges; every sample carries `model_name` (the path's name)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()

        def counter(name: str, help_text: str, *labels: str) -> Counter:
            return Counter(name, help_text, ("model_name", *labels), registry=self.registry)

        def gauge(name: str, help_text: str) -> Gauge:
            return Gauge(name, help_text, ("model_name",), registry=self.registry)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Verification steps of speculative requests (each "
                              "verifies one draft, possibly empty).").labels(model_name)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.").labels(model_name)
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                       "Draft tokens accepted by the target.").labels(model_name)
        self._success = counter("vllm:request_success", "Completed requests, by finish reason.", "finished_reason")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.").labels(model_name)
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.").labels(model_name)
        self.running = gauge("vllm:num_requests_running", "Requests in the engine call now running.").labels(model_name)
        self.waiting = gauge("vllm:num_requests_waiting", "Requests queued for the engine.").labels(model_name)
        self._http = counter("toolaudit:http_requests", "HTTP requests, by route and status code.", "code", "route")
        self.batches = counter("toolaudit:engine_batches", "Engine calls (batches).").labels(model_name)
        self.batch_requests = counter("toolaudit:engine_batch_requests",
                                      "Requests summed over engine calls.").labels(model_name)

    def http_request(self, route: str, code: int) -> None:
        self._http.labels(self.model_name, str(code), route).inc()

    def record(self, result: EngineResult, speculative: bool) -> None:
        """Count one finished request (failed ones only count as HTTP responses)."""
        if result.error:
            return
        self._success.labels(self.model_name, result.finish_reason or "stop").inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.generation_tokens.inc(result.completion_tokens)
        if speculative:
            self.drafts.inc(max(result.forward_passes - 1, 0))
            self.draft_tokens.inc(result.drafted_tokens)
            self.accepted_tokens.inc(result.accepted_tokens)

    def render(self) -> str:
        """The Prometheus text format (0.0.4), labels in declaration order, without `_created` timestamps."""
        lines = []
        for metric in self.registry.collect():
            name = metric.name + "_total" if metric.type == "counter" else metric.name
            lines += [f"# HELP {name} {metric.documentation}", f"# TYPE {name} {metric.type}"]
            for sample in metric.samples:
                if sample.name == name:
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
                    lines.append(f"{name}{{{labels}}} {floatToGoString(sample.value)}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
