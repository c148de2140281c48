"""The hf engine: replays requests through Hugging Face `model.generate()`, called as offline eval harnesses
call it (stock attention, generate's own decode loop, prompt lookup or an assistant model for speculation).

It exists because an eval harness and a serving stack are two decode paths: the seed incident ran offline
evals with `generate()` and production on vLLM with a draft model. Prompts are rendered as every in-process
engine renders them (`toolaudit.engines.prompting`), so hf, torch and vLLM paths see identical prompt tokens.
Modules: `engine` (HFEngine, imported when a path first needs it), `observe` (what generate() does not report
or do: finishes, step times, drafted tokens, per-row seeded draws), `config` (its path keys and `ENGINE`).
Importing this package imports no torch or transformers.
"""
