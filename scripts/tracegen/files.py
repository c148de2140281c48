"""Reading and writing the trace files: UTF-8, `\n` line ends, compact JSON lines, so reruns are byte-identical."""

from __future__ import annotations

import json
from pathlib import Path


def dumps(obj) -> str:
    """One compact JSON value (no spaces, non-ASCII kept): a log line, or a recorded arguments string."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: Path, records) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(dumps(r) + "\n" for r in records)


def write_json(path: Path, value) -> None:
    """An indented JSON document with a final newline (the expected-drifts file, the schema files)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(value, f, ensure_ascii=False, indent=2)
        f.write("\n")
