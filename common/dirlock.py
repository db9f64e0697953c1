"""One writer per directory: a lock that a second writer is refused by (a training job's
workdir: bert_jax/workdir_lock.py; a prepared corpus: prepare.py).

The lock is `DIR/LOCK`, a small JSON naming its holder (host, pid, process count, start
time, heartbeat).

How it works where the directory lives:
  local disk  `fcntl.flock` on LOCK. The kernel drops the lock when its process dies, so a
              writer killed with SIGKILL leaves no stale lock: the next one takes it over and
              says whose it was. (Lock and file are checked to be the same inode, so a file
              removed by a releasing writer is never locked by two.)
  gs://       an object created with the precondition `if_generation_match=0` (exactly one
              creator succeeds), refreshed by a heartbeat thread every `heartbeat_s`
              (conditional on its own generation). A holder whose heartbeat is older than
              `stale_after_s`, or that ran on this host under a pid that is gone, is dead:
              its lock is deleted conditionally on the generation read (so two writers cannot
              both take over) and taken. A preempted TPU VM's lock is taken over once it is
              `stale_after_s` old.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any, Iterator

from absl import logging

from common import errors
from common import fileio

LOCK_NAME = "LOCK"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 300.0


class LockedError(errors.UserError):
  """Another live writer holds the directory."""


@dataclasses.dataclass(frozen=True)
class Owner:
  """How the messages name a locked directory: `name` ("--workdir=DIR"), `why` two writers
  are refused, and what to use `instead`."""
  name: str
  why: str
  instead: str


def _holder_info(started: float, processes: int) -> dict[str, Any]:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "processes": processes, "started": started, "heartbeat": time.time()}


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


def _refusal(owner: Owner, info: dict[str, Any], extra: str = "") -> LockedError:
  return LockedError(f"{owner.name} is in use by {_describe(info)}{extra}. {owner.why} Wait "
                     f"for that job to finish (or stop it), or use {owner.instead}.")


class LocalLock:
  """flock on a local file: released by the kernel when the process dies."""

  def __init__(self, directory: str, owner: Owner):
    self.owner = owner
    self.path = os.path.join(os.fspath(fileio.path(directory)), LOCK_NAME)
    self.fd: int | None = None

  def acquire(self, started: float, processes: int = 1) -> None:
    import fcntl  # pylint: disable=g-import-not-at-top
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        info = _holder_of(fd)
        os.close(fd)
        raise _refusal(self.owner, info) from None
      try:
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)  # the file was removed by a releasing holder in between: retry
    previous = _read_json_fd(fd)
    if previous.get("pid"):
      logging.warning("Took over the lock of %s from %s, which is no longer running.",
                      self.owner.name, _describe(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_holder_info(started, processes)).encode(), 0)
    self.fd = fd

  def release(self) -> None:
    if self.fd is not None:
      with contextlib.suppress(OSError):
        os.unlink(self.path)
      os.close(self.fd)
      self.fd = None


def _holder_of(fd: int, wait_s: float = 5.0) -> dict[str, Any]:
  """The holder's JSON of a lock file that another process holds. A holder writes it just
  after taking the lock: a file still empty (or half written) is read again for up to
  `wait_s`, so the refusal names the holder."""
  deadline = time.time() + wait_s
  while not (info := _read_json_fd(fd)).get("pid") and time.time() < deadline:
    time.sleep(0.05)
  return info


def _read_json_fd(fd: int) -> dict[str, Any]:
  try:
    data = os.pread(fd, 1 << 16, 0)
    return json.loads(data) if data.strip() else {}
  except (OSError, ValueError):
    return {}


class GcsLock:
  """A lock object on GCS: conditional create, heartbeat, conditional takeover."""

  def __init__(self, directory: str, owner: Owner, heartbeat_s: float = HEARTBEAT_S,
               stale_after_s: float = STALE_AFTER_S):
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    self.exceptions = exceptions
    self.owner, self.heartbeat_s, self.stale_after_s = owner, heartbeat_s, stale_after_s
    bucket, _, prefix = os.fspath(directory)[len("gs://"):].partition("/")
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
          f"{self.owner.name} cannot be used: the bucket gs://{self.blob.bucket.name} "
          "does not exist. Create it (gcloud storage buckets create gs://BUCKET) or give "
          f"{self.owner.instead}.")

  def _read(self) -> tuple[dict[str, Any], int] | None:
    try:
      self.blob.reload()
      return json.loads(self.blob.download_as_bytes(if_generation_match=self.blob.generation)
                        or b"{}"), self.blob.generation
    except (self.exceptions.NotFound, self.exceptions.PreconditionFailed):
      return None
    except ValueError:
      return {}, self.blob.generation

  def acquire(self, started: float, processes: int = 1) -> None:
    self.info = _holder_info(started, processes)
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
        raise _refusal(self.owner, info, f", whose heartbeat is {age:.0f}s old (a lock not "
                       f"refreshed for {self.stale_after_s:.0f}s is taken over)")
      with contextlib.suppress(self.exceptions.NotFound, self.exceptions.PreconditionFailed):
        self.blob.delete(if_generation_match=generation)
        logging.warning("Took over the lock of %s from %s, %s.", self.owner.name,
                        _describe(info), "which is no longer running" if dead_here else
                        f"whose heartbeat stopped {age:.0f}s ago")
    else:
      raise LockedError(f"Could not take the lock {self.blob.name} of {self.owner.name} (it "
                        "keeps changing hands): is another job starting on it?")
    self._thread = threading.Thread(target=self._beat, name="directory-lock-heartbeat",
                                    daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      self.info["heartbeat"] = time.time()
      try:
        self.blob.upload_from_string(json.dumps(self.info), if_generation_match=self.generation)
        self.generation = self.blob.generation
      except self.exceptions.PreconditionFailed:
        logging.error("The lock of %s was taken over by another job (this job's heartbeat "
                      "was late): stop one of the two jobs.", self.owner.name)
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not refresh the lock of %s: %s", self.owner.name, e)

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.generation is not None:
      with contextlib.suppress(Exception):
        self.blob.delete(if_generation_match=self.generation)
      self.generation = None


def make_lock(directory: str, owner: Owner, *, heartbeat_s: float = HEARTBEAT_S,
              stale_after_s: float = STALE_AFTER_S) -> LocalLock | GcsLock:
  key = os.fspath(fileio.path(directory))
  if key.startswith("gs://"):
    return GcsLock(key, owner, heartbeat_s, stale_after_s)
  return LocalLock(key, owner)


@contextlib.contextmanager
def hold(directory: str, owner: Owner, *, heartbeat_s: float = HEARTBEAT_S,
         stale_after_s: float = STALE_AFTER_S) -> Iterator[None]:
  """Holds `directory`'s lock for the block (one process; creates the directory); raises
  LockedError when another live writer holds it."""
  lock = make_lock(directory, owner, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)
  if isinstance(lock, GcsLock):
    lock.check_bucket()
  fileio.path(directory).mkdir(parents=True, exist_ok=True)
  lock.acquire(started=time.time())
  try:
    yield
  finally:
    lock.release()
