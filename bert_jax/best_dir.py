"""A fine-tuning run's best/ directory: where it lies and what its marker records. The one
place that knows the layout; finetuned.py writes and reads the parameters, the loader,
the embedding tools, predict and the suite find best/ and its record through here.

    best_dir.of(workdir)             # WORKDIR/best
    best_dir.of_run(path)            # a run's complete best/, else `path` itself
    best_dir.recorded_task(path)     # the task config the run recorded there (or None)

best/ holds the parameters in the export format and `config.json` (the marker): the labels
and the run's task config, written after the parameters and removed before they are
replaced, so best/ is complete exactly when its marker exists.
"""
from __future__ import annotations

import json
from typing import Any

from common import fileio

NAME = "best"
MARKER = "config.json"


def of(workdir) -> Any:
  """WORKDIR/best (a path of the path layer)."""
  return fileio.path(workdir) / NAME


def is_complete(directory) -> bool:
  return (fileio.path(directory) / MARKER).exists()


def of_run(path: str) -> str:
  """A fine-tuning workdir's best/ when complete (what it keeps of the run), else `path`."""
  best = of(path)
  return str(best) if is_complete(best) else path


def recorded(directory) -> dict[str, Any]:
  """The marker's record ({"labels", "task"}; older versions' also "bert"), {} where there is
  none or it is not a JSON object."""
  marker = fileio.path(directory) / MARKER
  try:
    saved = json.loads(marker.read_text())
  except (FileNotFoundError, OSError, ValueError):
    return {}
  return saved if isinstance(saved, dict) else {}


def recorded_task(directory) -> dict[str, Any] | None:
  """The task config a run recorded in its best/ `directory`, or None."""
  task = recorded(directory).get("task")
  return task if isinstance(task, dict) else None


def unmark(directory) -> None:
  """Removes the marker (before the parameters are replaced)."""
  marker = fileio.path(directory) / MARKER
  if marker.exists():
    marker.unlink()


def mark(directory, labels, task: dict[str, Any]) -> None:
  """Writes the marker (after the parameters): best/ is complete."""
  (fileio.path(directory) / MARKER).write_text(
      json.dumps({"labels": labels, "task": task}, indent=2))
