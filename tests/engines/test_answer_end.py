"""Where an answer ends: the JSON value a prefilled tool call opens with (`completion.ValueEnd`), the text cut
there on every engine, the paths that end there by default, and the hf engine's rows stopped there."""

from __future__ import annotations

import pytest

from toolaudit.engines.completion import ValueEnd, cut_after_stop, value_closed
from toolaudit.engines.paths import PathConfig, PromptConfig

CALL = '{"name": "search", "arguments": {"q": "a } in a string, a \\" quote and a \\\\", "n": [1, {"x": 2}]}}'


def scan(pieces: list[str]) -> tuple[int, int] | None:
    """(piece index, offset) where the value closes, fed piece by piece."""
    scanner = ValueEnd()
    for index, piece in enumerate(pieces):
        offset = scanner.feed(piece)
        if offset is not None:
            return index, offset
    return None


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(CALL)])
def test_the_value_closes_at_its_last_brace_whatever_the_pieces(size):
    text = CALL + "\n</tool_call>"
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    index, offset = scan(pieces)
    assert index * size + offset == len(CALL)  # braces and quotes inside strings do not count


def test_blanks_before_the_value_and_arrays_and_pretty_printing():
    pretty = '{\n  "name": "f",\n  "arguments": {\n    "a": 1\n  }\n}'
    assert scan(["\n  ", pretty, "\n</tool_call>"]) == (1, len(pretty))
    assert scan(['[{"name": "f"}, ', '{"name": "g"}]', " tail"]) == (1, len('{"name": "g"}]'))


@pytest.mark.parametrize("answer", ["I will call it: {\"name\": \"f\"}", '"{}"', "", "   ", '{"name": "f", "arg'])
def test_an_answer_that_is_not_a_closed_value_never_ends_there(answer):
    assert scan([answer]) is None and not value_closed(answer, 0)
    if answer.strip() and not answer.startswith("{"):
        assert scan([answer, '{"a": 1}']) is None  # a value after other text is not the answer's


def test_the_text_is_cut_after_the_value_or_the_stop_whichever_comes_first():
    prefill = "<tool_call>\n"
    text = prefill + CALL + "\n</tool_call>"
    assert cut_after_stop(text, len(prefill), ("</tool_call>",)) == text
    assert cut_after_stop(text, len(prefill), ("</tool_call>",), value_end=True) == prefill + CALL
    early = prefill + '{"name": "f"STOP, "arguments": {}}'
    assert cut_after_stop(early, len(prefill), ("STOP",), value_end=True) == prefill + '{"name": "f"STOP'
    # the prefill's own text is not scanned: only the answer's
    assert cut_after_stop("{x" + "a}b", 2, (), value_end=True) == "{xa}b"
    assert cut_after_stop("{" + '{"a": 1}b', 1, (), value_end=True) == '{{"a": 1}'


def test_paths_that_prefill_a_call_end_at_its_value_by_default():
    default = PathConfig(name="p")
    assert default.value_end and default.stop_strings == ("</tool_call>",)
    assert default.config_dict()["value_end"] is True
    explicit = PathConfig(name="p", stop=("</tool_call>",))
    assert not explicit.value_end and "value_end" not in explicit.config_dict()  # an explicit stop keeps its end
    bare = PathConfig(name="p", prompt=PromptConfig(prefill=""))
    assert not bare.value_end and "value_end" not in bare.config_dict()
    assert default.config_dict() != explicit.config_dict()  # another path: a resumed run cannot mix the two


def test_the_hf_recorder_stops_a_row_where_its_value_closes():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from toolaudit.engines.hf.observe import Recorder

    pieces = {1: "{", 2: "}", 3: "a", 4: '"', 9: "<eos>"}
    recorder = Recorder(None, [9], width=2, rows=3, device="cpu", piece=pieces.__getitem__)
    # rows after a 2-token prompt: row 0 closes its value at its 3rd token; row 1's brace is inside a string;
    # row 2 never opens a value (its first token is not a brace)
    steps = [[1, 1, 3], [3, 4, 1], [2, 2, 2], [3, 4, 3], [2, 2, 9]]
    prompt = [[0, 0]] * 3
    seen = [list(p) for p in prompt]
    done = None
    for step in steps:
        for row, token in enumerate(step):
            seen[row].append(token)
        done = recorder(torch.tensor(seen), None)
    assert recorder.finish == [3, 5, 5] and done.tolist() == [True, True, True]
