"""The HTTP engine: replays requests against any OpenAI-compatible Chat Completions endpoint (vLLM, SGLang, a
gateway, `toolaudit serve`). Modules: `engine` (OpenAIEngine: client, retries, key handling, sampled requests),
`failures` (what a failed attempt means: retry, backoff, a refused n), `shapes` (request and response bodies),
`config` (its path keys and `ENGINE`). Importing this package imports no openai.
"""
