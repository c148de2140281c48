"""The hf engine on the tiny random Llama over SmolLM2's tokenizer (float32, `helpers.build_tiny_model`).

generate() greedy must equal the torch engine's target token for token (same prompts, same weights; a
replay of demo calls through both paths drifts on none), per prompt and in left-padded batches; prompt lookup
and an assistant model must equal greedy with their proposal counters filled; a request that cannot run is an
error row; the fingerprint is JSON-ready and `close()` lets the model go.
"""

from __future__ import annotations

import json

import pytest
from helpers import DEMO, REPO, build_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from toolaudit.engines import make_engine  # noqa: E402
from toolaudit.engines.base import EngineRequest  # noqa: E402
from toolaudit.engines.paths import parse_path  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


@pytest.fixture(scope="module", autouse=True)
def restore_threads():
    """Every path here runs one thread (tiny matrices; a shared 2-core machine); restore the count after."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory):
    """Repeats its last token with a wide margin, so prompt lookup proposes and the target accepts."""
    return build_tiny_model(tmp_path_factory.mktemp("echo-llama"), echo=True)


def path(name: str, model_dir, **table):
    return parse_path(name, {"engine": "hf", "model": str(model_dir), "dtype": "float32", "max_tokens": 12,
                             "threads": 1, **table})


def demo_requests(n: int) -> list[EngineRequest]:
    """Every 10th call of traces/demo.jsonl: different applications, so prompt lengths differ (padding)."""
    rows = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()][::10][:n]
    return [EngineRequest(key=f"demo-{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
            for i, r in enumerate(rows)]


def check_evidence(result, greedy: bool = True) -> None:
    assert result.error is None, result.error
    assert result.completion_tokens == len(result.token_ids) == len(result.margins) == len(result.top2) > 0
    assert all(m >= 0 for m in result.margins)
    if greedy:
        assert [pair[0] for pair in result.top2] == result.token_ids
    assert 0 < result.ttft_s <= result.latency_s and result.forward_passes > 0
    assert result.finish_reason in ("stop", "length") and result.text.startswith("<tool_call>\n")


def test_replay_hf_greedy_equals_torch_target(tmp_path, tiny_dir):
    from toolaudit.replay.replayer import ReplayOptions, replay_traces
    from toolaudit.store import Store

    paths_file = tmp_path / "paths.toml"
    common = f'model = "{tiny_dir}"\ndtype = "float32"\nmax_tokens = 12\nthreads = 1\n'
    paths_file.write_text(f'[paths.tiny]\nengine = "torch"\nbatch_size = 4\n{common}\n'
                          f'[paths.tiny-hf]\nengine = "hf"\n{common}')
    options = ReplayOptions(traces=[str(DEMO)], baseline="tiny", candidate="tiny-hf", paths_file=str(paths_file),
                            limit=6, schema_dir=str(REPO / "schemas"), chunk=6)
    with Store(tmp_path / "r.duckdb") as store:
        run_id, counts = replay_traces(store, options)
        assert counts.replayed == 6 and counts.errors == 0
        drifted = store.query("SELECT count(*) FROM calls WHERE run_id = ? AND drifted", [run_id])[1][0][0]
        assert drifted == 0
        outs = store.rows("SELECT * FROM outputs WHERE run_id = ? ORDER BY session_id, call_index, side", [run_id])
        assert len(outs) == 12
        for baseline, candidate in zip(outs[::2], outs[1::2]):
            assert baseline["side"] == "baseline" and candidate["side"] == "candidate"
            assert candidate["token_ids"] == baseline["token_ids"] and candidate["text"] == baseline["text"]
            assert candidate["forward_passes"] == candidate["completion_tokens"] and candidate["drafted_tokens"] == 0
        run = store.run_row(run_id)
        assert run["baseline_fingerprint"] != run["candidate_fingerprint"]


def test_padded_batches_and_toolaudit_attention_equal_per_prompt(tiny_dir):
    requests = demo_requests(6)
    per_prompt = make_engine(path("hf", tiny_dir)).generate(requests)
    assert len({r.prompt_tokens for r in per_prompt}) > 1  # ragged: padded rows really are padded
    for name, table in (("padded", {"batch": "padded", "batch_size": 4}), ("grouped", {"attention": "toolaudit"})):
        other = make_engine(path(name, tiny_dir, **table)).generate(requests)
        for a, b in zip(per_prompt, other):
            check_evidence(a)
            check_evidence(b)
            assert a.key == b.key and a.token_ids == b.token_ids and a.text == b.text, name


def test_prompt_lookup_equals_greedy_with_counters_and_cuts_at_the_stop(echo_dir):
    """The echo model repeats "\\n": with a stop of 7 newlines (the prefill's own "\\n" counts: transformers
    matches stop strings over the whole sequence) a verification pass accepts tokens past the stop, which
    must be cut so prompt lookup gives greedy's tokens."""
    requests = demo_requests(2)
    stop = "\n" * 7
    greedy = make_engine(path("greedy", echo_dir, stop=[stop], max_tokens=16)).generate(requests)
    lookup = make_engine(path("lookup", echo_dir, stop=[stop], max_tokens=16, speculative=NGRAM)).generate(requests)
    for g, s in zip(greedy, lookup):
        check_evidence(g)
        check_evidence(s)
        assert g.token_ids == s.token_ids and g.text == s.text and s.finish_reason == "stop"
        assert len(s.token_ids) == 6 and g.forward_passes == 6
        assert s.drafted_tokens > 0 and 0 < s.accepted_tokens <= s.drafted_tokens
        assert s.forward_passes < len(s.token_ids)
        assert s.accepted_tokens + s.forward_passes > len(s.token_ids)  # the last pass went past the stop
    unstopped = make_engine(path("lookup-nostop", echo_dir, stop=[], speculative=NGRAM)).generate(requests[:1])[0]
    check_evidence(unstopped)
    assert unstopped.finish_reason == "length" and len(unstopped.token_ids) == 12


def test_assistant_model_equals_greedy(tiny_dir):
    """The model as its own draft: every proposal is accepted, k per verification pass."""
    requests = demo_requests(2)
    greedy = make_engine(path("greedy", tiny_dir)).generate(requests)
    draft = make_engine(path("draft", tiny_dir, speculative={"method": "draft_model", "model": str(tiny_dir),
                                                               "num_speculative_tokens": 3})).generate(requests)
    for g, d in zip(greedy, draft):
        check_evidence(d)
        assert g.token_ids == d.token_ids
        assert d.drafted_tokens == d.accepted_tokens == 9 and d.forward_passes == 3  # 3 passes x (3 + 1) tokens


def test_bad_requests_become_error_rows(tiny_dir, monkeypatch):
    requests = demo_requests(4)
    requests.insert(1, EngineRequest(key="too-long", messages=[{"role": "user", "content": "word " * 2100}]))
    requests.insert(3, EngineRequest(key="boom", messages=[{"role": "user", "content": "Zanzibar Zanzibar"}]))
    padded = make_engine(path("padded", tiny_dir, batch="padded", batch_size=3))
    padded.load()
    marker = padded.tokenizer("Zanzibar Zanzibar", add_special_tokens=False)["input_ids"]
    real = padded._model.generate

    def failing(**kwargs):  # fails any batch holding the "boom" prompt
        rows = kwargs["input_ids"].tolist()
        if any(any(r[i:i + len(marker)] == marker for i in range(len(r))) for r in rows):
            raise RuntimeError("boom")
        return real(**kwargs)

    monkeypatch.setattr(padded._model, "generate", failing)
    results = padded.generate(requests)
    assert [r.key for r in results] == [r.key for r in requests]
    assert "exceeds the model's 2048 positions" in results[1].error and results[1].text == ""
    assert results[3].error == "RuntimeError: boom"
    monkeypatch.undo()
    alone = make_engine(path("alone", tiny_dir)).generate([r for r in requests if r.key.startswith("demo")])
    kept = [r for r in results if r.key.startswith("demo")]
    assert [r.token_ids for r in kept] == [r.token_ids for r in alone]  # the failed batch was retried row by row


def test_sampling_is_seeded_per_request(tiny_dir):
    requests = demo_requests(2)
    first = make_engine(path("s1", tiny_dir, temperature=1.5, seed=7)).generate(requests)
    again = make_engine(path("s2", tiny_dir, temperature=1.5, seed=7)).generate(requests[::-1])[::-1]
    other = make_engine(path("s3", tiny_dir, temperature=1.5, seed=8)).generate(requests)
    for result in first:
        check_evidence(result, greedy=False)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]  # per-request seeds: order does not matter
    assert [r.token_ids for r in first] != [r.token_ids for r in other]


def test_each_sample_is_the_draw_of_its_own_seed_in_any_batch(tiny_dir):
    """Samples 0..2 of two calls: per prompt, run twice, and in left-padded batches in reverse order (other
    neighbours, other rows): the same draws, so a sample depends on its seed only; the samples of a call differ
    (temperature 1 on a random model); top_k = 1 gives the greedy answer, per prompt and padded."""
    calls = {"a": "What is the price of AMZN?", "b": "Book a table for two at 7pm, please."}  # short: fast
    requests = [EngineRequest(key, [{"role": "user", "content": text}], sample=i) for key, text in calls.items()
                for i in range(3)]
    sampled = {"temperature": 1.0, "seed": 3, "samples": 3, "max_tokens": 6}
    per_prompt = make_engine(path("pp", tiny_dir, **sampled))
    first = [r.token_ids for r in per_prompt.generate(requests)]
    assert [r.token_ids for r in per_prompt.generate(requests)] == first
    padded = make_engine(path("pad", tiny_dir, **sampled, batch="padded", batch_size=4))
    results = padded.generate(requests[::-1])[::-1]
    for result in results:
        check_evidence(result, greedy=False)
    assert [r.token_ids for r in results] == first
    assert len({tuple(t) for t in first[:3]}) == 3 and len({tuple(t) for t in first[3:]}) == 3
    greedy = [r.token_ids for r in make_engine(path("g", tiny_dir, max_tokens=6)).generate(requests[::3])]
    for batch in ("per_prompt", "padded"):
        top1 = make_engine(path(f"k1-{batch}", tiny_dir, **sampled, top_k=1, batch=batch)).generate(requests[::3])
        assert [r.token_ids for r in top1] == greedy
    components = padded.fingerprint_components()
    assert components["sampling"]["samples"] == 3 and components["generate_kwargs"]["top_k"] == 0
    assert "samples" not in make_engine(path("g", tiny_dir)).fingerprint_components()["sampling"]


def test_fingerprint_and_close(tiny_dir):
    from toolaudit.engines.hf import engine as hf_engine

    engine = make_engine(path("fp", tiny_dir, speculative=NGRAM))
    components = engine.fingerprint_components()
    json.dumps(components)
    assert components["engine"] == "hf" and components["attention"] == "sdpa" and components["batch"] == "per_prompt"
    assert components["generate_kwargs"]["prompt_lookup_num_tokens"] == 4
    assert components["generate_kwargs"]["max_matching_ngram_size"] == 3
    assert components["transformers"] and components["torch"] and len(components["model_identity"]) == 16
    key = (str(tiny_dir), "float32", "cpu", "sdpa")
    engine.generate(demo_requests(1))
    assert key in hf_engine._models
    others = [e for e in hf_engine._users[key] if e != id(engine)]
    engine.close()
    assert (key in hf_engine._models) == bool(others)  # freed unless another live path holds it
    assert engine.generate(demo_requests(1))[0].error is None  # loads again after close
    engine.close()
