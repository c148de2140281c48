"""Tool-call extraction: every supported format, and the broken outputs a drifting decode path produces."""

from __future__ import annotations

import json
import time

import pytest

from toolaudit.validate.toolcalls import parse_arguments, parse_message, parse_text


def _openai(arguments, content=None, **extra):
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": arguments}}
    return {"role": "assistant", "content": content, "tool_calls": [call], **extra}


# --- OpenAI messages -------------------------------------------------------------------------------------


def test_openai_string_arguments():
    raw = '{"query": "open issues", "limit": 5}'
    out = parse_message(_openai(raw))
    assert (out.status, out.format, out.text, out.error) == ("ok", "openai", "", None)
    (call,) = out.calls
    assert (call.name, call.id, call.arguments, call.raw_arguments, call.arguments_error) == (
        "search",
        "call_1",
        {"query": "open issues", "limit": 5},
        raw,
        None,
    )


def test_openai_object_arguments_have_no_raw_string():
    out = parse_message(_openai({"query": "x"}, content="Looking it up."))
    assert out.status == "ok" and out.text == "Looking it up."
    assert out.calls[0].arguments == {"query": "x"} and out.calls[0].raw_arguments is None


def test_openai_several_calls_keep_order_and_ids():
    msg = {
        "content": "",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": [1, 2]}'}},
        ],
    }
    out = parse_message(msg)
    assert [(c.id, c.name, c.arguments) for c in out.calls] == [("a", "f", {}), ("b", "g", {"x": [1, 2]})]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('{"query": ', "arguments are not valid JSON: "),
        ("[1, 2]", "arguments must be a JSON object, got array"),
        ('"text"', "arguments must be a JSON object, got string"),
        ("5", "arguments must be a JSON object, got integer"),
        ('{"limit": NaN}', "arguments contain NaN/Infinity"),
        ('{"limit": Infinity}', "arguments contain NaN/Infinity"),
        ('{"limit": [-Infinity]}', "arguments contain NaN/Infinity"),
        ('{"limit": 1e400}', "arguments contain NaN/Infinity"),
    ],
)
def test_openai_bad_arguments_are_recorded_not_raised(raw, error):
    out = parse_message(_openai(raw))
    assert out.status == "ok"  # the call was made; its arguments are what is broken
    call = out.calls[0]
    assert call.arguments_error is not None and call.arguments_error.startswith(error)
    assert call.raw_arguments == raw


@pytest.mark.parametrize("raw", ["", "  ", None])
def test_empty_or_missing_arguments_mean_no_arguments(raw):
    out = parse_message(_openai(raw))
    assert out.calls[0].arguments == {} and out.calls[0].arguments_error is None


def test_nan_inside_an_already_parsed_object_is_rejected():
    value, error = parse_arguments({"a": {"b": [1.0, float("nan")]}})
    assert error == "arguments contain NaN/Infinity" and value["a"]["b"][0] == 1.0


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ("not a dict", "tool_calls[0] is not an object"),
        (None, "tool_calls[0] is not an object"),
        ({"id": "x", "type": "function"}, "tool_calls[0] has no function object"),
        ({"function": {"name": 7, "arguments": "{}"}}, "tool_calls[0] has no string name"),
        ({"function": {"arguments": "{}"}}, "tool_calls[0] has no string name"),
    ],
)
def test_malformed_tool_call_entries_are_unparseable(entry, error):
    out = parse_message({"content": "hi", "tool_calls": [entry]})
    assert (out.status, out.format, out.error, out.text, out.calls) == (
        "unparseable",
        "openai",
        error,
        "hi",
        (),
    )


def test_tool_calls_not_a_list_is_unparseable():
    assert parse_message({"content": None, "tool_calls": {"a": 1}}).status == "unparseable"


@pytest.mark.parametrize("message", [None, "text", 42, ["x"]])
def test_message_that_is_not_a_dict(message):
    out = parse_message(message)
    assert out.status == "unparseable" and "not an object" in out.error


def test_none_content_and_no_tool_calls_is_no_call():
    out = parse_message({"role": "assistant", "content": None})
    assert (out.status, out.text, out.calls) == ("no_tool_call", "", ())


def test_empty_tool_calls_falls_back_to_content_text():
    out = parse_message(
        {"content": '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "tool_calls": []}
    )
    assert (out.status, out.format, out.calls[0].arguments) == ("ok", "hermes", {"a": 1})


def test_content_parts_are_joined():
    msg = {
        "content": [
            {"type": "text", "text": "Hello "},
            {"type": "image_url", "image_url": {}},
            {"type": "text", "text": "world"},
        ]
    }
    out = parse_message(msg)
    assert (out.status, out.text) == ("no_tool_call", "Hello world")


def test_legacy_function_call_field():
    out = parse_message({"content": None, "function_call": {"name": "f", "arguments": '{"a": 1}'}})
    assert (out.status, out.format, out.calls[0].name, out.calls[0].arguments) == (
        "ok",
        "openai",
        "f",
        {"a": 1},
    )


def test_five_megabyte_argument_string():
    blob = "é" * 2_500_000  # 5 MB of UTF-8
    raw = json.dumps({"document": blob}, ensure_ascii=False)
    start = time.perf_counter()
    out = parse_message(_openai(raw))
    text_out = parse_text(f'<tool_call>{{"name": "store", "arguments": {raw}}}</tool_call>')
    elapsed = time.perf_counter() - start
    assert out.calls[0].arguments["document"] == blob and out.calls[0].raw_arguments is raw
    assert text_out.calls[0].arguments["document"] == blob
    assert elapsed < 30.0, elapsed  # 0.04 s here: a guard against super-linear parsing (hours), not a speed bar


def test_unicode_names_and_arguments():
    out = parse_message(_openai('{"city": "Zürich", "note": "日本語 ✓", "emoji": "\\ud83d\\ude00"}'))
    assert out.calls[0].arguments == {"city": "Zürich", "note": "日本語 ✓", "emoji": "😀"}
    hermes = parse_text('Voilà <tool_call>{"name": "météo", "arguments": {"ville": "Montréal"}}</tool_call>')
    assert (hermes.calls[0].name, hermes.calls[0].arguments, hermes.text) == (
        "météo",
        {"ville": "Montréal"},
        "Voilà",
    )


# --- text formats ----------------------------------------------------------------------------------------


def test_hermes_single_call_with_surrounding_text():
    out = parse_text(
        'I will search.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\n'
    )
    assert (out.status, out.format, out.text) == ("ok", "hermes", "I will search.")
    assert (out.calls[0].name, out.calls[0].arguments) == ("search", {"q": "x"})


def test_hermes_multiple_calls():
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": [true, null]}}\n</tool_call>'
    )
    out = parse_text(text)
    assert [(c.name, c.arguments) for c in out.calls] == [("a", {"x": 1}), ("b", {"y": [True, None]})]
    assert out.text == ""


def test_hermes_unterminated_final_tag_is_tolerated():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
    text += '<tool_call>\n{"name": "b", "arguments": {"k": 2}}\n'
    assert not text.rstrip().endswith("</tool_call>")
    out = parse_text(text)
    assert (
        out.status == "ok"
        and [c.name for c in out.calls] == ["a", "b"]
        and out.calls[1].arguments == {"k": 2}
    )


def test_hermes_prefilled_opening_tag():
    # The embedded engine prefills "<tool_call>\n", so the model's text starts with the JSON.
    out = parse_text('{"name": "search", "arguments": {"limit": 5}}\n</tool_call>')
    assert (out.status, out.format, out.calls[0].arguments) == ("ok", "hermes", {"limit": 5})


def test_hermes_parameters_alias_and_missing_arguments():
    out = parse_text(
        '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call><tool_call>{"name": "now"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in out.calls] == [("a", {"x": 1}), ("now", {})]


def test_hermes_arguments_as_string_keep_raw():
    out = parse_text('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert out.calls[0].arguments == {"x": 1} and out.calls[0].raw_arguments == '{"x": 1}'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>', "tool call 0: invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "tool call 0: call has no string 'name'"),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "tool call 0: call has no string 'name'"),
        ("<tool_call></tool_call>", "tool call 0: invalid JSON"),
        (
            '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>',
            "tool call 0: JSON contains NaN/Infinity",
        ),
    ],
)
def test_hermes_broken_is_unparseable_with_raw_text(text, error):
    out = parse_text(text)
    assert (out.status, out.format, out.text, out.calls) == ("unparseable", "hermes", text, ())
    assert out.error.startswith(error), out.error


def test_bare_json_object_and_array():
    one = parse_text('  {"name": "a", "arguments": {"x": 1}}  ')
    assert (one.status, one.format, one.calls[0].arguments) == ("ok", "json", {"x": 1})
    many = parse_text('[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"z": "q"}}]')
    assert [(c.name, c.arguments) for c in many.calls] == [("a", {}), ("b", {"z": "q"})]


def test_bare_json_with_trailing_prose():
    out = parse_text('{"name": "a", "arguments": {"x": 1}}\nThat should do it.')
    assert (out.status, out.text) == ("ok", "That should do it.")


def test_llama_python_tag():
    out = parse_text('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert (out.status, out.format, out.calls[0].arguments) == ("ok", "json", {"city": "Paris"})


def test_fenced_json():
    out = parse_text('```json\n{"name": "a", "arguments": {"x": 1}}\n```')
    assert (out.status, out.format, out.calls[0].arguments, out.text) == ("ok", "json", {"x": 1}, "")
    inline = parse_text('Here you go:\n```\n[{"name": "a", "parameters": {}}]\n```\nBye')
    assert (inline.status, inline.text) == ("ok", "Here you go:\nBye")


def test_fence_in_prose_that_is_not_a_call_is_prose():
    text = 'Example config:\n```json\n{"debug": true}\n```'
    assert parse_text(text).status == "no_tool_call"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "a", "arguments": ', "invalid JSON"),
        ('{"answer": 42}', "JSON is not a tool call: call has no string 'name'"),
        ('{"name": "Bob", "age": 3}', "JSON is not a tool call: call has no 'arguments' or 'parameters'"),
        ('[{"name": "a", "arguments": {}}, 7]', "JSON is not a tool call: call is a JSON integer"),
        ('```json\n{"name": "a", "arguments": {]}\n```', "invalid JSON"),
    ],
)
def test_json_attempts_that_fail_are_unparseable(text, error):
    out = parse_text(text)
    assert (out.status, out.format, out.text) == ("unparseable", "json", text)
    assert out.error.startswith(error), out.error


def test_empty_json_array_is_an_explicit_no_call():
    assert parse_text("[]").status == "no_tool_call"


def test_mistral_array_and_object():
    out = parse_text('[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]')
    assert (out.status, out.format, [c.name for c in out.calls]) == ("ok", "mistral", ["a", "b"])
    single = parse_text('Sure. [TOOL_CALLS] {"name": "a", "arguments": {"x": 2}}')
    assert (single.calls[0].arguments, single.text) == ({"x": 2}, "Sure.")


def test_mistral_v11_name_args_segments():
    out = parse_text('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[CALL_ID]abc123456[ARGS]{}')
    assert [(c.name, c.id, c.arguments) for c in out.calls] == [("a", None, {"x": 1}), ("b", "abc123456", {})]


def test_mistral_broken():
    text = "[TOOL_CALLS] [{'name': 'a'}]"
    out = parse_text(text)
    assert (out.status, out.format, out.text) == ("unparseable", "mistral", text)


@pytest.mark.parametrize("text", ["", "   ", "The weather in Paris is sunny.", "I can't call {tools} today."])
def test_plain_prose_is_no_tool_call(text):
    out = parse_text(text)
    assert (out.status, out.calls, out.error, out.text) == ("no_tool_call", (), None, text.strip())


def test_parse_text_never_raises_on_odd_input():
    assert parse_text(None).status == "no_tool_call"
    assert parse_text(b"bytes").status == "unparseable"
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_text(deep).status == "unparseable"
    assert parse_text("<tool_call>" + deep).status == "unparseable"
