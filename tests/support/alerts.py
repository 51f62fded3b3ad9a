"""A failure hook for tests (TIERED_ON_FAILURE_CALLBACK=tests.support.alerts:record): appends one JSON
line per call to the file named by $TIERED_TEST_ALERTS, so a test sees what the project's on_failure
passed on."""

from __future__ import annotations

import json
import os
from typing import Any


def record(context: Any) -> None:
    ti = context.get("ti") or context.get("task_instance")
    line = {"task_id": getattr(ti, "task_id", None), "dag_id": getattr(context.get("dag_run"), "dag_id", None),
            "exception": str(context.get("exception") or context.get("reason") or "")}
    with open(os.environ["TIERED_TEST_ALERTS"], "a") as f:
        f.write(json.dumps(line) + "\n")
