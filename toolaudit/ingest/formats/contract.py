"""What a trace format is: a light object (`TraceFormat`) registered under the entry-point group
`toolaudit.formats`, the built-in formats exactly as a third-party distribution's (docs/plugins.md).

A format has a name (`--format NAME`), a one-line description (`--help`), a detection rule asked about the first
records of a file (`Sample`), and a reader. Most formats give `read(path, keys) -> Conversion`: the whole file
turned into calls, problems and skipped records (toolaudit validates, orders and indexes them, and names the
original file, line and record in every error). A format that can be read in parallel chunks and found again by
position gives `open(path, keys, require_response) -> TraceSource` instead (the OpenAI log does: byte offsets).
Importing a format's module must stay cheap: no model, no network, nothing beyond its parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolaudit.ingest.formats.base import Conversion, Keys
from toolaudit.ingest.sources import TraceSource


@dataclass(frozen=True)
class Sample:
    """One non-blank line of a file, as detection sees it: the raw bytes and, when the line is JSON, its value.
    `raw` is empty when a reader asks which format an already parsed record looks like (`registry.mixed`)."""

    raw: bytes
    value: Any = None
    is_json: bool = False


# True: the record is in this format. False: it is not. None: it could be, a later record decides (an OTLP
# export whose first spans carry no GenAI attribute could be OTel GenAI or OpenInference).
Detect = Callable[[Sample], "bool | None"]


@dataclass(frozen=True)
class TraceFormat:
    """A trace format as the registry knows it."""

    name: str
    description: str  # one line, shown by --help
    detect: Detect
    read: Callable[[str, Keys], Conversion] | None = None
    open: Callable[[str, Keys, bool, bool], TraceSource] | None = None  # (path, keys, require_response, detected)
    record_word: str = "record"  # what an error message calls one record: "span 5f2c: ..."
    looks_like: str = ""  # a record's name in hints: "this line looks like <looks_like>, but ..."

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a trace format name is letters, digits, - and _ (got {self.name!r})")
        if (self.read is None) == (self.open is None):
            raise ValueError(f"trace format {self.name!r} needs exactly one of read= and open=")

    @property
    def a_record(self) -> str:
        return self.looks_like or f"a {self.name} record"
