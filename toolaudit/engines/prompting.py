"""Render a recorded request (messages + tools) into the prompt text an in-process model sees (torch, hf, vllm).

Rendering depends only on the request and the path's `PromptConfig`, never on how the path decodes, so two
paths that share a prompt config see byte-identical prompts and any drift between them comes from decoding.

Models whose chat template understands `tools` get it (`apply_chat_template(..., tools=...)`). Templates
without tool support (SmolLM2's) get a compact Hermes-style system prompt that lists the tools as one-line
JSON, previous tool calls as `<tool_call>` blocks and tool results as `<tool_response>` user turns. A 135M model
only produces tool-call JSON when shown examples, so up to two short made-up exchanges (their functions listed
with the request's) precede the conversation, and the assistant turn can be prefilled (default
`<tool_call>\\n`). Prompts are kept compact because on CPU prefill is a large share of a replayed call's cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .paths import PromptConfig

HERMES_INSTRUCTIONS = (
    "You can call functions. Their signatures are in <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "Answer with a function call as JSON inside <tool_call></tool_call> tags, like:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-object>}}\n</tool_call>"
)

# Made-up exchanges that show the format, with their functions. The functions are listed in <tools> after the
# request's own: on 24 demo prompts that raised the share of calls naming a listed tool from 13 to 17, because
# the examples then show choosing from the list rather than inventing a name.
FEW_SHOT: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("What's the weather in Paris, in celsius?",
     {"name": "get_weather", "description": "Current weather in a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                     "required": ["city"]}},
     {"city": "Paris", "unit": "celsius"}),
    ("Find 3 flights from Boston to Denver on 2024-05-02.",
     {"name": "search_flights", "description": "Search flights.",
      "parameters": {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                                                      "date": {"type": "string"}, "limit": {"type": "integer"}},
                     "required": ["origin", "destination", "date"]}},
     {"origin": "Boston", "destination": "Denver", "date": "2024-05-02", "limit": 3}),
)


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt text (ending with the prefill) and the prefill itself, which belongs to the answer text."""

    text: str
    prefill: str


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a `tools` argument (SmolLM2's silently ignores it)."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):  # named templates: look for one dedicated to tool use
        template = template.get("tool_use") or template.get("default") or ""
    return "tools" in template


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
           config: PromptConfig) -> RenderedPrompt:
    """The full prompt for one request: chat template + tools + few-shot examples + assistant prefill."""
    functions = [_function(t) for t in tools]
    if functions:  # the examples' functions join the list (see FEW_SHOT); without tools there are no examples
        functions += [fn for _, fn, _ in FEW_SHOT[: config.few_shot]]
    few_shot = config.few_shot if tools else 0
    if template_supports_tools(tokenizer):
        conv = _with_examples(_native_messages(messages), few_shot)
        text = tokenizer.apply_chat_template(conv, tools=[{"type": "function", "function": f} for f in functions],
                                             add_generation_prompt=True, tokenize=False)
    else:
        conv = hermes_messages(messages, functions, few_shot)
        text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    return RenderedPrompt(text=text + config.prefill, prefill=config.prefill)


def hermes_messages(messages: list[dict[str, Any]], functions: list[dict[str, Any]],
                    few_shot: int) -> list[dict[str, str]]:
    """Plain role/content turns for a template without tool support (system prompt lists the tools)."""
    system_parts = [_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    if functions:
        listing = "\n".join(_compact(f) for f in functions)
        system_parts.append(HERMES_INSTRUCTIONS.format(tools=listing))
    system = "\n\n".join(p for p in system_parts if p)
    conv: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    for question, fn, arguments in FEW_SHOT[:few_shot]:
        conv.append({"role": "user", "content": question})
        conv.append({"role": "assistant", "content": _tool_call_block(fn["name"], arguments)})
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        if role == "tool":
            block = f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"
            if conv and conv[-1]["role"] == "user" and conv[-1]["content"].startswith("<tool_response>"):
                conv[-1]["content"] += "\n" + block  # parallel results share one turn
            else:
                conv.append({"role": "user", "content": block})
        elif role == "assistant":
            parts = [_text(m.get("content"))] + [
                _tool_call_block(c.get("function", c).get("name", ""), _arguments(c.get("function", c)))
                for c in m.get("tool_calls") or []
            ]
            conv.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        else:
            conv.append({"role": "user", "content": _text(m.get("content"))})
    return conv


def _native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for tool-aware templates: text content, and tool-call arguments as objects (what they expect)."""
    out = []
    for m in messages:
        m = dict(m)
        m["content"] = _text(m.get("content"))
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {"type": "function", "function": {"name": c.get("function", c).get("name", ""),
                                                  "arguments": _arguments(c.get("function", c))}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def _with_examples(conv: list[dict[str, Any]], few_shot: int) -> list[dict[str, Any]]:
    start = 1 if conv and conv[0].get("role") == "system" else 0
    examples = []
    for question, fn, arguments in FEW_SHOT[:few_shot]:
        examples.append({"role": "user", "content": question})
        examples.append({"role": "assistant", "content": _tool_call_block(fn["name"], arguments)})
    return conv[:start] + examples + conv[start:]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool (`{"type": "function", "function": {...}}`) or a bare function -> name/description/parameters."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else {}
    out = {"name": fn.get("name", "")}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def _tool_call_block(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _arguments(fn: dict[str, Any]) -> Any:
    """Recorded arguments are a JSON string (OpenAI) or an object; keep the raw string if it is not JSON."""
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)
