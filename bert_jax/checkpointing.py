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

import contextlib
import errno
import json
import logging as logging_std
import sys
import threading
import warnings
from typing import Any, Iterator, Mapping

from absl import logging
from etils import epath
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bert_jax import loader
from common import errors
from common import fileio


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


class ModelMismatchError(errors.UserError, ValueError):
  """The checkpoints of a workdir do not fit the configured model (not corruption)."""


class InputsChangedError(errors.UserError, ValueError):
  """A resume whose data or initial weights differ from those the checkpoints were made from."""


INPUTS_KEY = "bert_jax_inputs"  # what the run is made from (Trainer.inputs)
SCHEDULE_KEY = "bert_jax_schedule_steps"  # the learning-rate schedule's length
# When the checkpoint's MANIFEST.json was due: "on_completion" (as soon as its save
# completed); absent in checkpoints of versions that wrote it when the next save began.
CHECKSUMS_KEY = "bert_jax_checksums"
_SAVED_EXTRA = (loader.MODEL_CONFIG_KEY, INPUTS_KEY, SCHEDULE_KEY, CHECKSUMS_KEY)


class NoRestorableCheckpointError(errors.UserError, RuntimeError):
  """Every checkpoint of a workdir is damaged."""


def _read_saved_config(step_dir: epath.Path) -> dict:
  try:
    return json.loads((step_dir / "config" / "metadata").read_text())
  except Exception:  # pylint: disable=broad-except
    return {}


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
  return out


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any],
                   sections: tuple[str, ...] | None = None) -> list[str]:
  """`field: saved X, now Y` for every config field (of `sections`, default all) that differs."""
  keep = lambda k: sections is None or k.split(".")[0] in sections
  a = {k: v for k, v in _flatten(dict(saved)).items() if keep(k)}
  b = {k: v for k, v in _flatten(dict(now)).items() if keep(k)}
  return [f"{k}: saved {a.get(k)!r}, now {b.get(k)!r}" for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k) and k.split(".")[0] not in _SAVED_EXTRA]


class _DiskFullRecords(logging_std.Filter):
  """Drops Orbax's own error records (with their tracebacks), and asyncio's about its
  futures whose exception nobody read, about a save that failed for lack of disk space:
  the save's caller reports that as one DiskFullError line."""

  def filter(self, record: logging_std.LogRecord) -> bool:
    if record.levelno < logging_std.ERROR or not any(
        lib in record.pathname for lib in ("orbax", "asyncio")):  # asyncio: unretrieved futures
      return True
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += str(record.exc_info[1])
      e = record.exc_info[1]
      return not (_is_disk_full(e) or "No space left on device" in text)
    return "No space left on device" not in text and "Disk quota exceeded" not in text


def _quiet_unraisable_hook(previous):
  """TensorStore callbacks that fire after a failed asynchronous save find Orbax's event
  loop closed and print `RuntimeError: Event loop is closed` tracebacks as unraisable
  exceptions (one per write in flight): drop exactly those."""
  def hook(unraisable):
    value = unraisable.exc_value
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
      return
    previous(unraisable)
  hook.bert_jax_quiet = True
  return hook


def _quiet_failed_saves() -> None:
  # Orbax's write coroutines still queued when a save failed are never awaited: Python
  # warns about each at exit. The failure itself is reported (DiskFullError or the error).
  warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                          category=RuntimeWarning)
  if not getattr(sys.unraisablehook, "bert_jax_quiet", False):
    sys.unraisablehook = _quiet_unraisable_hook(sys.unraisablehook)
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DiskFullRecords) for f in handler.filters):
    handler.addFilter(_DiskFullRecords())


class Checkpointer:
  """A thin policy layer over `ocp.CheckpointManager`: when to save, what to keep,
  checksums of what was saved, and how to recover from a checkpoint that is damaged."""

  def __init__(self, workdir: str, *, keep: int, keep_period: int | None,
               async_save: bool = True):
    self.directory = fileio.path(workdir) / "checkpoints"
    self.corrupt_directory = fileio.path(workdir) / "checkpoints_corrupt"
    self._saving: int | None = None  # the step whose save is in flight
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, keep_period=keep_period or None, create=True,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    self._manifest_thread: threading.Thread | None = None
    self._save_error: Exception | None = None  # what made the save in flight fail
    _quiet_failed_saves()
    self.manager = ocp.CheckpointManager(self.directory, item_names=("state", "data", "config"),
                                         options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any,
           config: ml_collections.ConfigDict, extra: Mapping[str, Any] | None = None
           ) -> None:
    """Starts an asynchronous save (all processes must call it). `extra` is kept beside the
    run's config (Trainer.saved_with_config: the model's BertConfig, so the checkpoint says
    what model it holds whatever the job; the run's inputs and schedule length). As soon as
    the step is complete, process 0 writes its MANIFEST.json (sizes and checksums), in a
    thread that the next save, `wait` or `close` joins."""
    self.wait()  # the previous save (its checksums are usually long written)
    if step in self.manager.all_steps():
      return
    saved_config = json.loads(config.to_json_best_effort())
    saved_config.update(extra or {})
    saved_config[CHECKSUMS_KEY] = "on_completion"
    self._saving = step
    with self._reporting_save_errors(step):
      self.manager.save(step, force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave({"process_count": jax.process_count(),
                                  "states": gather_process_states(data_state)}),
          config=ocp.args.JsonSave(saved_config)))
    if jax.process_index() == 0:
      self._manifest_thread = threading.Thread(target=self._complete, args=(step,),
                                               name="checkpoint-manifest", daemon=True)
      self._manifest_thread.start()

  def _complete(self, step: int) -> None:
    """Waits for the save of `step` to complete, then checksums it (the manifest thread);
    a failed save is kept for the main thread's `wait` to raise."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self._save_error = e
      return
    self._write_manifest(step)

  def wait(self) -> None:
    """Waits for the save in flight and its checksums; raises what made it fail."""
    if self._manifest_thread is not None:
      self._manifest_thread.join()
      self._manifest_thread = None
    with self._reporting_save_errors():
      failed, self._save_error = self._save_error, None
      if failed is not None:
        raise failed
      self.manager.wait_until_finished()
    self._saving = None

  def _write_manifest(self, step: int) -> None:
    step_dir = self.directory / str(step)
    try:
      if step_dir.exists() and not (step_dir / fileio.MANIFEST).exists():
        fileio.write_manifest(step_dir)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Could not write the checksums of %s (it stays usable, unverified): "
                      "%s: %s", step_dir, type(e).__name__, e)

  def restore(self, abstract_state: Any, config: ml_collections.ConfigDict | None = None
              ) -> tuple[int, Any, Any, dict] | None:
    """Latest restorable checkpoint -> (step, state, this process's data state, config).

    `abstract_state` holds jax.ShapeDtypeStructs with the target shardings (any mesh, any
    device count; a checkpoint saved with the other `scan_layers` layout is converted).
    Returns None when there is no checkpoint. A checkpoint proven damaged (its files differ
    from the checksums written at save; or, without checksums, a read fails; or it holds
    NaN/Inf) is moved to `checkpoints_corrupt/` with a warning and the previous one is
    used; if none is left, raises. A checkpoint whose parameters do not fit the configured
    model is not damaged: that raises `ModelMismatchError` (naming the `config` fields
    that changed) and moves nothing; so does one whose intact files fail to restore.
    """
    errors_seen = []
    why = {"checksums": lambda problems: (
               "is unreadable: its files differ from the checksums written when it was saved ("
               + "; ".join(problems[:4]) + (", ..." if len(problems) > 4 else "") + ")"),
           "unreadable": lambda e: (f"is unreadable (truncated or corrupt): {type(e).__name__}: "
                                    f"{str(e)[:500]}"),
           "nonfinite": lambda _: ("is damaged: it holds NaN or infinite parameters or optimizer "
                                   "moments")}

    def read(path):  # (what was restored, in the saved layout; that layout)
      target = self._restore_target(int(path.name), abstract_state, config)
      return self.manager.restore(int(path.name), args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target),
          data=ocp.args.JsonRestore(), config=ocp.args.JsonRestore())), target

    found = loader.newest_intact(
        [self.directory / str(s) for s in sorted(self.manager.all_steps(), reverse=True)],
        read, lambda r: loader.nonfinite((r[0]["state"].params, r[0]["state"].opt_state)),
        lambda path, kind, detail: errors_seen.append(
            self._skip_damaged(int(path.name), why[kind](detail))),
        verify=lambda path: gather_process_states(
            fileio.verify_manifest(path) if jax.process_index() == 0 else None)[0],
        not_damage=(ModelMismatchError,),
        # checksums verified: the files are intact, the target differs
        intact_error=lambda path, e: self._unrestorable(int(path.name), config, e))
    if found is not None:
      path, (restored, target), verified = found
      _log_verification(path, verified, restored["config"] or {})
      state = restored["state"]
      if target is not abstract_state:
        state = loader.onto_layout_of(state, abstract_state)
      step = int(path.name)
      return step, state, _data_state(step, restored["data"]), restored["config"] or {}
    if errors_seen:
      raise NoRestorableCheckpointError(
          "No checkpoint in %s could be restored (each was moved to %s):\n  %s\n  Start "
          "afresh in a new --workdir, or put back a good copy of a checkpoint." % (
              self.directory, self.corrupt_directory, "\n  ".join(errors_seen)))
    return None

  def _skip_damaged(self, step: int, why: str) -> str:
    path = self.directory / str(step)
    logging.warning("Checkpoint %s %s. It is moved to %s and the previous checkpoint is "
                    "used.", path, why, self.corrupt_directory)
    self._quarantine(step)
    return f"{path} {why}"[:700]

  def _unrestorable(self, step: int, config, e: Exception) -> ModelMismatchError:
    path = self.directory / str(step)
    changed = config_changes(_read_saved_config(path), json.loads(config.to_json_best_effort())
                             ) if config is not None else []
    return ModelMismatchError(
        f"Checkpoint {path} is intact (its checksums match) but does not restore into the "
        f"configured training state; nothing was moved or changed.\n"
        + ("  Config fields that differ from the saved run's:\n    " + "\n    ".join(changed[:20])
           + "\n" if changed else "")
        + f"  Error: {type(e).__name__}: {str(e)[:300]}\n  Either resume with the config the run "
        f"was started with (saved in {path / 'config'}), or train in another --workdir (with "
        f"--config.init_checkpoint={self.directory.parent} to start from these weights).")

  def _restore_target(self, step: int, abstract_state: Any,
                      config: ml_collections.ConfigDict | None) -> Any:
    """`abstract_state`, or it in the saved layout when only the layout differs (scan_layers);
    `ModelMismatchError` when the saved parameters' names or shapes (checkpoint metadata) do
    not fit the model. Unreadable metadata is left to the restore (which may find it damaged)."""
    try:
      got = loader.saved_param_shapes(self.directory / str(step))
    except Exception:  # pylint: disable=broad-except
      return abstract_state
    target = abstract_state
    if loader.is_scanned(got) != loader.is_scanned(loader.flat(abstract_state.params)):
      target = loader.abstract_layout(abstract_state, loader.is_scanned(got))
    want = {k: tuple(a.shape) for k, a in loader.flat(target.params).items()}
    if got == want:
      return target
    diffs = [f"model lacks {'/'.join(k)}" for k in sorted(set(got) - set(want))]
    diffs += [f"checkpoint lacks {'/'.join(k)}" for k in sorted(set(want) - set(got))]
    diffs += [f"{'/'.join(k)}: saved {got[k]}, model {want[k]}"
              for k in sorted(set(got) & set(want)) if got[k] != want[k]]
    changed = []
    if config is not None:
      changed = config_changes(_read_saved_config(self.directory / str(step)),
                               json.loads(config.to_json_best_effort()), ("model", "data"))
    raise ModelMismatchError(
        f"The checkpoints in {self.directory} (latest: step {step}) hold a model that does not "
        f"fit the configured one; nothing was moved or changed.\n"
        + ("  Config fields that differ from the saved run's:\n    " + "\n    ".join(changed) + "\n"
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

  @contextlib.contextmanager
  def _reporting_save_errors(self, step: int | None = None) -> Iterator[None]:
    """A save that fails for lack of disk space (raised here or, for an asynchronous save,
    at the next save/wait/close) becomes one DiskFullError naming the step and the way on."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      if not _is_disk_full(e):
        raise
      failed = self._saving or step
      self._saving = None
      try:
        latest = max((s for s in self.manager.all_steps() if s != failed), default=None)
      except Exception:  # pylint: disable=broad-except
        latest = None
      raise DiskFullError(
          f"Saving checkpoint {failed} in {self.directory} failed: no space left on device. "
          f"Earlier checkpoints are intact (latest complete: "
          f"{'step %d' % latest if latest is not None else 'none'}). Free space (or use a "
          f"--workdir on a larger disk) and rerun the same command to continue.") from None

  def close(self) -> None:
    self.wait()
    self.manager.close()


def _log_verification(path: epath.Path, verified: bool, saved_config: Mapping[str, Any]
                      ) -> None:
  if verified:
    logging.info("Checkpoint %s verified: its files match the checksums written when it was "
                 "saved.", path)
  elif saved_config.get(CHECKSUMS_KEY):
    logging.info("Checkpoint %s has no checksums (MANIFEST.json): the job was stopped after "
                 "its save completed, before its checksums were written (or writing them "
                 "failed, as logged then); restored unverified.", path)
  else:
    logging.info("Checkpoint %s has no checksums (MANIFEST.json): it was saved by an earlier "
                 "version of bert_jax, which wrote them only when the next save began; "
                 "restored unverified.", path)


def _data_state(step: int, data: Mapping[str, Any] | None) -> Any:
  """This process's input iterator state from a checkpoint's `data` item (None: start afresh,
  as when the checkpoint was written by another number of processes)."""
  data = data or {}
  states = data.get("states") or [None]
  if data.get("process_count", 1) == jax.process_count():
    return states[jax.process_index()]
  logging.warning("Checkpoint %d was written by %s processes, this job has %d: the "
                  "input iterators start afresh.", step, data.get("process_count"),
                  jax.process_count())
  return None


class DiskFullError(errors.UserError, OSError):
  """A checkpoint could not be written: the disk (or quota) is full."""


def _is_disk_full(e: BaseException | None) -> bool:
  """Whether `e` or an exception it was raised from is ENOSPC / EDQUOT."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    text = str(e)
    if "No space left on device" in text or "Disk quota exceeded" in text:
      return True
    e = e.__cause__ or e.__context__
  return False
