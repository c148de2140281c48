"""Preloaded by the kill suite's fork server (`killpoints.Launcher`): loads the torch models named in
$TOOLAUDIT_KILL_WARM (os.pathsep-separated model directories, float32 on CPU) into the embedded engine's
in-process cache (`toolaudit.engines.torch.models.load_model`), so each forked replay skips the ~1-2 s load and
decodes at once. The kills are about what reaches the database; loading is exercised by the other tests."""

from __future__ import annotations

import os

from toolaudit.engines.torch.models import load_model

for _model in filter(None, os.environ.get("TOOLAUDIT_KILL_WARM", "").split(os.pathsep)):
    load_model(_model, "float32", "cpu", "native")
