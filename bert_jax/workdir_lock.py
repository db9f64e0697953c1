"""One writer per workdir: a lock that a second job on the same workdir is refused by.

    with workdir_lock.hold(workdir):
      ...  # build the vocabulary / prepared data, train, checkpoint

The lock is `workdir/LOCK`, a small JSON naming its holder (host, pid, process count, start
time, heartbeat). Only process 0 of a multi-host job takes it (the job holds it once); every
process learns the outcome, so a refused job stops on every host. The entry point takes it
once (bert_jax.main.run); the jobs it runs do not.

How it works where the workdir lives:
  local disk  `fcntl.flock` on LOCK. The kernel drops the lock when its process dies, so a
              job killed with SIGKILL leaves no stale lock: the next job takes it over and
              says whose it was. (Lock and file are checked to be the same inode, so a file
              removed by a releasing job is never locked by two.)
  gs://       an object created with the precondition `if_generation_match=0` (exactly one
              creator succeeds), refreshed by a heartbeat thread every `heartbeat_s`
              (conditional on its own generation). A holder whose heartbeat is older than
              `stale_after_s`, or that ran on this host under a pid that is gone, is dead:
              its lock is deleted conditionally on the generation read (so two jobs cannot
              both take over) and taken. A preempted TPU VM's lock is taken over once it is
              `stale_after_s` old.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any, Iterator

from absl import logging
import jax
import numpy as np
from jax.experimental import multihost_utils

from input_pipeline import errors
from input_pipeline import fileio

LOCK_NAME = "LOCK"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 300.0


class WorkdirLockedError(errors.UserError):
  """Another live job holds the workdir."""


def _holder_info(started: float) -> dict[str, Any]:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "processes": jax.process_count(), "started": started, "heartbeat": time.time()}


def _describe(info: dict[str, Any]) -> str:
  started = info.get("started")
  when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
  return f"process {info.get('pid', '?')} on host {info.get('host', '?')} (started {when})"


def _pid_alive(pid: Any) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, TypeError, ValueError):
    return True
  return True


def _refusal(workdir: str, info: dict[str, Any], extra: str = "") -> WorkdirLockedError:
  return WorkdirLockedError(
      f"--workdir={workdir} is in use by {_describe(info)}{extra}. Two jobs writing one "
      f"workdir would overwrite each other's checkpoints. Wait for that job to finish (or stop "
      f"it), or use another --workdir.")


class _LocalLock:
  """flock on a local file: released by the kernel when the process dies."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(os.fspath(fileio.path(workdir)), LOCK_NAME)
    self.fd: int | None = None

  def acquire(self, started: float) -> None:
    import fcntl  # pylint: disable=g-import-not-at-top
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        info = _read_json_fd(fd)
        os.close(fd)
        raise _refusal(self.workdir, info) from None
      try:
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)  # the file was removed by a releasing holder in between: retry
    previous = _read_json_fd(fd)
    if previous.get("pid"):
      logging.warning("Took over the lock of --workdir=%s from %s, which is no longer running.",
                      self.workdir, _describe(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_holder_info(started)).encode(), 0)
    self.fd = fd

  def release(self) -> None:
    if self.fd is not None:
      with contextlib.suppress(OSError):
        os.unlink(self.path)
      os.close(self.fd)
      self.fd = None


def _read_json_fd(fd: int) -> dict[str, Any]:
  try:
    data = os.pread(fd, 1 << 16, 0)
    return json.loads(data) if data.strip() else {}
  except (OSError, ValueError):
    return {}


class _GcsLock:
  """A lock object on GCS: conditional create, heartbeat, conditional takeover."""

  def __init__(self, workdir: str, heartbeat_s: float, stale_after_s: float):
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    self.exceptions = exceptions
    self.workdir, self.heartbeat_s, self.stale_after_s = workdir, heartbeat_s, stale_after_s
    bucket, _, prefix = os.fspath(workdir)[len("gs://"):].partition("/")
    name = "/".join(p for p in (prefix.strip("/"), LOCK_NAME) if p)
    self.blob = storage.Client().bucket(bucket).blob(name)
    self.generation: int | None = None
    self.info: dict[str, Any] = {}
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def check_bucket(self) -> None:
    """A missing bucket is a UserError at once (TensorFlow's gs:// mkdir would retry it for
    minutes before failing). Credentials allowed objects but not bucket metadata cannot
    tell: the job goes on."""
    try:
      exists = self.blob.bucket.exists()
    except self.exceptions.Forbidden:
      return
    if not exists:
      raise errors.UserError(
          f"--workdir={self.workdir} cannot be used: the bucket gs://{self.blob.bucket.name} "
          "does not exist. Create it (gcloud storage buckets create gs://BUCKET) or give "
          "another --workdir.")

  def _read(self) -> tuple[dict[str, Any], int] | None:
    try:
      self.blob.reload()
      return json.loads(self.blob.download_as_bytes(if_generation_match=self.blob.generation)
                        or b"{}"), self.blob.generation
    except (self.exceptions.NotFound, self.exceptions.PreconditionFailed):
      return None
    except ValueError:
      return {}, self.blob.generation

  def acquire(self, started: float) -> None:
    self.info = _holder_info(started)
    for _ in range(10):
      try:
        self.blob.upload_from_string(json.dumps(self.info), if_generation_match=0)
        self.generation = self.blob.generation
        break
      except self.exceptions.PreconditionFailed:
        pass
      read = self._read()
      if read is None:
        continue  # released in between: try again
      info, generation = read
      age = time.time() - float(info.get("heartbeat", 0))
      dead_here = info.get("host") == socket.gethostname() and not _pid_alive(info.get("pid"))
      if not dead_here and age < self.stale_after_s:
        raise _refusal(self.workdir, info, f", whose heartbeat is {age:.0f}s old (a lock not "
                       f"refreshed for {self.stale_after_s:.0f}s is taken over)")
      with contextlib.suppress(self.exceptions.NotFound, self.exceptions.PreconditionFailed):
        self.blob.delete(if_generation_match=generation)
        logging.warning("Took over the lock of --workdir=%s from %s, %s.", self.workdir,
                        _describe(info), "which is no longer running" if dead_here else
                        f"whose heartbeat stopped {age:.0f}s ago")
    else:
      raise WorkdirLockedError(f"Could not take the lock {self.workdir}/{LOCK_NAME} (it keeps "
                               "changing hands): is another job starting on this workdir?")
    self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat",
                                    daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      self.info["heartbeat"] = time.time()
      try:
        self.blob.upload_from_string(json.dumps(self.info), if_generation_match=self.generation)
        self.generation = self.blob.generation
      except self.exceptions.PreconditionFailed:
        logging.error("The lock of --workdir=%s was taken over by another job (this job's "
                      "heartbeat was late): stop one of the two jobs.", self.workdir)
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not refresh the lock of --workdir=%s: %s", self.workdir, e)

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.generation is not None:
      with contextlib.suppress(Exception):
        self.blob.delete(if_generation_match=self.generation)
      self.generation = None


def _unusable(workdir: str, e: Exception) -> errors.UserError:
  """Why a workdir cannot be written to, as one line naming it and the way on."""
  if isinstance(e, (FileExistsError, NotADirectoryError)):
    why = "it (or a directory above it) is a file, not a directory"
  elif isinstance(e, PermissionError):
    why = "it is not writable by this user (permission denied)"
  else:
    why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
  return errors.UserError(f"--workdir={workdir} cannot be used: {why}. Give a directory this job "
                          "can create and write (on gs://: an existing bucket it may write to).")


@contextlib.contextmanager
def hold(workdir: str, *, heartbeat_s: float = HEARTBEAT_S,
         stale_after_s: float = STALE_AFTER_S) -> Iterator[None]:
  """Holds the workdir's lock for the block; raises WorkdirLockedError (on every process)
  when another live job holds it; an empty workdir (e.g. `--workdir=$WORKDIR` with the
  variable unset, which would put everything in the current directory) is a UserError."""
  if not os.fspath(workdir or "").strip():
    raise errors.UserError("--workdir is empty (e.g. --workdir=$WORKDIR with WORKDIR unset): "
                           "give the directory for the run's checkpoints, summaries and data.")
  key = os.fspath(fileio.path(workdir))
  lock, error = None, None
  if jax.process_index() == 0:
    lock = (_GcsLock(key, heartbeat_s, stale_after_s) if key.startswith("gs://")
            else _LocalLock(key))
    try:
      if isinstance(lock, _GcsLock):
        lock.check_bucket()
      fileio.path(workdir).mkdir(parents=True, exist_ok=True)
      lock.acquire(started=time.time())
    except WorkdirLockedError as e:
      lock, error = None, e
    except errors.UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (a file, read-only, no bucket)
      lock, error = None, _unusable(workdir, e)
  if jax.process_count() > 1:
    ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if not ok and error is None:
      error = WorkdirLockedError(f"--workdir={workdir} is in use by another job (see process "
                                 "0's log).")
  if error is not None:
    raise error
  try:
    yield
  finally:
    if lock is not None:
      lock.release()
