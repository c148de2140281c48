"""Builders of the committed trace files, shared by scripts/make_example_traces.py and make_demo_traces.py.

One job per module:
- `chat`: the OpenAI Chat Completions shapes both logs record (request, response, tool call, usage, a finished
  turn in the context) and the seeded ids;
- `files`: reading and writing JSONL/JSON byte for byte the same way on every platform;
- `bfcl`, `bfcl_schema`: BFCL v4 data as sessions' raw material, and a tiny validator for its loose schemas;
- `example_sessions`, `drifts`, `example_logs`: the example canary night (sessions from BFCL, the injected
  drifts and their expected entries, the two logs and the ground-truth file);
- `demo_tools`, `demo_turns`, `demo_sessions`: the demo's small tool catalogue with its strict schemas, one user
  turn per tool, and the sessions a 135M model can answer.

Standard library only. Every builder draws from one `random.Random` in a fixed order, so the files are
byte-identical on every run: change the order of draws and the committed traces change.
"""
