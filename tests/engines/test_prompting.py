"""Rendering a request for a chat template without tool support (`toolaudit.engines.prompting`, shared by the
in-process engines): Hermes-style tools, few-shot examples, tool calls and results as turns, the prefill."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_rendering_hermes_prompt(chat_tokenizer):
    from toolaudit.engines.paths import PromptConfig
    from toolaudit.engines.prompting import render, template_supports_tools

    tokenizer = chat_tokenizer
    assert not template_supports_tools(tokenizer)
    tools = [{"type": "function", "function": {"name": "get_quote", "description": "Price.",
                                               "parameters": {"type": "object",
                                                              "properties": {"symbol": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You are a bank."},
        {"role": "user", "content": "Price of AMZN?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_quote", "arguments": "{\"symbol\":\"AMZN\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"price\": 1}"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"price\": 2}"},
        {"role": "user", "content": [{"type": "text", "text": "And MSFT?"}]},
    ]
    text = render(tokenizer, messages, tools, PromptConfig(few_shot=1, prefill="<tool_call>\n")).text
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a bank.\n\n")
    assert '{"name":"get_quote","description":"Price.","parameters":' in system
    assert '"name":"get_weather"' in system and "search_flights" not in text  # one example, listed with the tools
    assert "What's the weather in Paris" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_quote", "arguments": {"symbol": "AMZN"}}\n'
            "</tool_call><|im_end|>") in text
    assert ("<|im_start|>user\n<tool_response>\n{\"price\": 1}\n</tool_response>\n<tool_response>\n"
            "{\"price\": 2}\n</tool_response><|im_end|>") in text
    assert text.endswith("<|im_start|>user\nAnd MSFT?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n")
    bare = render(tokenizer, [{"role": "user", "content": "hi"}], [], PromptConfig()).text
    assert "<tools>" not in bare and "Paris" not in bare  # no tools: no tool list, no examples
