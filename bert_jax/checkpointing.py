"""Orbax checkpoints of a training run: state, data position and config.

Layout: `workdir/checkpoints/<step>/{state, data, config}`.
  state   the TrainState pytree (step, float32 params, optimizer state), sharded:
          every host writes its own shards; restore reshards onto any mesh.
  data    the input iterators' positions (`get_state()` JSON), one per process.
  config  the run's ConfigDict as JSON, for humans and for sanity checks.

Saves are asynchronous (training continues while the files are written) and
atomic (Orbax writes to a temporary directory and renames it when complete), so
a killed job leaves either a complete checkpoint or one that is ignored. A
checkpoint that still fails to restore is reported, moved to
`workdir/checkpoints_corrupt/`, and the previous one is used.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from absl import logging
from etils import epath
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bert_jax import convert
from bert_jax import fileio


def gather_process_states(state: Mapping[str, Any] | None) -> list[Any]:
  """Every process's (small, JSON) iterator state, in process order, on every process."""
  if jax.process_count() == 1:
    return [state]
  data = np.frombuffer(json.dumps(state).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([data.size], np.int32))
  padded = np.zeros(int(np.max(lengths)), np.uint8)
  padded[:data.size] = data
  everything = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode()) for row, n in
          zip(everything.reshape(len(lengths), -1), np.ravel(lengths))]


class ModelMismatchError(ValueError):
  """The checkpoints of a workdir do not fit the configured model (not corruption)."""


def _read_saved_config(step_dir: epath.Path) -> dict:
  try:
    return json.loads((step_dir / "config" / "metadata").read_text())
  except Exception:  # pylint: disable=broad-except
    return {}


class Checkpointer:
  """A thin policy layer over `ocp.CheckpointManager`: when to save, what to keep,
  and how to recover from a checkpoint that does not restore."""

  def __init__(self, workdir: str, *, keep: int, keep_period: int | None,
               async_save: bool = True):
    self.directory = fileio.path(workdir) / "checkpoints"
    self.corrupt_directory = fileio.path(workdir) / "checkpoints_corrupt"
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, keep_period=keep_period or None, create=True,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, item_names=("state", "data", "config"),
                                         options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any,
           config: ml_collections.ConfigDict, model_config: Mapping[str, Any] | None = None
           ) -> None:
    """Starts an asynchronous save (all processes must call it). `model_config` (the
    model's BertConfig as a dict) is kept beside the run's config, so the checkpoint says
    what model it holds whatever the job (a fine-tuning config has no model sizes)."""
    if step in self.manager.all_steps():
      return
    saved_config = json.loads(config.to_json_best_effort())
    if model_config is not None:
      saved_config[convert.MODEL_CONFIG_KEY] = dict(model_config)
    self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"process_count": jax.process_count(),
                                "states": gather_process_states(data_state)}),
        config=ocp.args.JsonSave(saved_config)))

  def restore(self, abstract_state: Any, config: ml_collections.ConfigDict | None = None
              ) -> tuple[int, Any, Any, dict] | None:
    """Latest restorable checkpoint -> (step, state, this process's data state, config).

    `abstract_state` holds jax.ShapeDtypeStructs with the target shardings
    (any mesh). Returns None when there is no checkpoint. Corrupt checkpoints are
    skipped (newest first) with a warning; if none restores, raises. A checkpoint whose
    parameters do not fit the configured model is not corrupt: that raises
    `ModelMismatchError` (naming the `config` fields that changed) and moves nothing.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    errors = []
    for step in steps:
      self._check_model_fits(step, abstract_state, config)
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(), config=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-except
        path = self.directory / str(step)
        logging.warning("Checkpoint %s is unreadable (truncated or corrupt) and is skipped; "
                        "falling back to the previous one. Error: %s: %s",
                        path, type(e).__name__, str(e)[:500])
        errors.append(f"{path}: {type(e).__name__}: {e}"[:500])
        self._quarantine(step)
        continue
      data = restored["data"] or {}
      states = data.get("states") or [None]
      if data.get("process_count", 1) == jax.process_count():
        data_state = states[jax.process_index()]
      else:
        logging.warning("Checkpoint %d was written by %s processes, this job has %d: the "
                        "input iterators start afresh.", step, data.get("process_count"),
                        jax.process_count())
        data_state = None
      return step, restored["state"], data_state, restored["config"] or {}
    if errors:
      raise RuntimeError("No checkpoint in %s could be restored:\n  %s" % (
          self.directory, "\n  ".join(errors)))
    return None

  def _check_model_fits(self, step: int, abstract_state: Any,
                        config: ml_collections.ConfigDict | None) -> None:
    """Compares the saved parameters' names and shapes (checkpoint metadata) with the
    model's; unreadable metadata is left to the restore (which may find it corrupt)."""
    try:
      got = convert.saved_param_shapes(os.fspath(self.directory / str(step)))
    except Exception:  # pylint: disable=broad-except
      return
    want = {tuple(str(getattr(k, "key", k)) for k in path): tuple(a.shape) for path, a in
            jax.tree_util.tree_flatten_with_path(abstract_state.params)[0]}
    if got == want:
      return
    diffs = [f"model lacks {'/'.join(k)}" for k in sorted(set(got) - set(want))]
    diffs += [f"checkpoint lacks {'/'.join(k)}" for k in sorted(set(want) - set(got))]
    diffs += [f"{'/'.join(k)}: saved {got[k]}, model {want[k]}"
              for k in sorted(set(got) & set(want)) if got[k] != want[k]]
    changed = []
    if config is not None:
      saved = _read_saved_config(self.directory / str(step))
      now = json.loads(config.to_json_best_effort())
      for section in ("model", "data"):
        a, b = saved.get(section) or {}, now.get(section) or {}
        changed += [f"{section}.{k}: saved {a.get(k)!r}, now {b.get(k)!r}"
                    for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    raise ModelMismatchError(
        f"The checkpoints in {self.directory} (latest: step {step}) hold a model that does not "
        f"fit the configured one; nothing was moved or changed.\n"
        + (f"  Config fields that differ from the saved run's:\n    " + "\n    ".join(changed) + "\n"
           if changed else "")
        + "  Parameters that differ:\n    " + "\n    ".join(diffs[:12])
        + (f"\n    ... ({len(diffs) - 12} more)" if len(diffs) > 12 else "")
        + "\n  Either resume with the config the run was started with (saved in "
        f"{self.directory / str(step) / 'config'}), train the new model in another --workdir, "
        f"or start it from these weights there with --config.init_checkpoint={self.directory.parent}.")

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step aside so that later saves of that step can succeed."""
    if jax.process_index() == 0:
      src = self.directory / str(step)
      self.corrupt_directory.mkdir(parents=True, exist_ok=True)
      dst = self.corrupt_directory / str(step)
      suffix = 0
      while dst.exists():
        suffix += 1
        dst = self.corrupt_directory / f"{step}.{suffix}"
      # A directory rename: atomic on local disks; on GCS a copy then a delete (a kill in
      # between leaves both, and the copy under checkpoints_corrupt/ is only a copy).
      src.rename(dst)
      logging.warning("Moved unreadable checkpoint %s to %s.", src, dst)
    multihost_utils.sync_global_devices(f"quarantine_{step}")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
