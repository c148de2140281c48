"""Preloaded by the kill suite's fork server (`killpoints.Launcher`): fills the per-process caches every forked
command would otherwise fill again. The torch models named in $TOOLAUDIT_KILL_WARM (os.pathsep-separated
model directories, float32 on CPU) go into the embedded engine's cache (`toolaudit.engines.torch.models
.load_model`), so each replay skips the ~1-2 s load; the trace formats (entry points) are found once. The kills
are about what reaches the database; loading is exercised by the other tests."""

from __future__ import annotations

import os

from toolaudit.engines.torch.models import load_model
from toolaudit.ingest import registry

registry.registered()

for _model in filter(None, os.environ.get("TOOLAUDIT_KILL_WARM", "").split(os.pathsep)):
    load_model(_model, "float32", "cpu", "native")
