"""One writer per workdir: a lock that a second job on the same workdir is refused by.

    with workdir_lock.hold(workdir):
      ...  # build the vocabulary / prepared data, train, checkpoint

The lock is common/dirlock.py's `workdir/LOCK` (how it works locally and on gs://
is told there). Only process 0 of a multi-host job takes it (the job holds it once); every
process learns the outcome, so a refused job stops on every host. The entry point takes it
once (bert_jax.main.run); the jobs it runs do not.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from common import dirlock
from common import errors
from common import fileio

LOCK_NAME = dirlock.LOCK_NAME
HEARTBEAT_S = dirlock.HEARTBEAT_S
STALE_AFTER_S = dirlock.STALE_AFTER_S
WorkdirLockedError = dirlock.LockedError


def _owner(workdir: str) -> dirlock.Owner:
  return dirlock.Owner(f"--workdir={workdir}", "Two jobs writing one workdir would overwrite "
                       "each other's checkpoints.", "another --workdir")


_NOWHERE = "a symbolic link that leads to no directory (it loops, or its target is gone)"


def _dangling(path: str) -> bool:
  return os.path.islink(path) and not os.path.exists(path)


def _check_links(workdir: str) -> None:
  """A link at the top of a local workdir that leads nowhere (a loop, a removed target) is
  one line naming it: the job would fail writing through it (checkpoints/, vocab/, ...)."""
  if workdir.startswith("gs://"):
    return
  for entry in sorted(os.scandir(workdir), key=lambda e: e.name):
    if entry.is_symlink() and _dangling(entry.path):
      raise errors.UserError(f"{entry.path} is {_NOWHERE}, inside --workdir where the job "
                             "writes. Remove the link or point it at a directory.")


def _unusable(workdir: str, e: Exception) -> errors.UserError:
  """Why a workdir cannot be written to, as one line naming it and the way on."""
  if not workdir.startswith("gs://") and _dangling(os.fspath(workdir).rstrip("/")):
    why = f"it is {_NOWHERE}"
  elif isinstance(e, (FileExistsError, NotADirectoryError)):
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
  lock, error = None, None
  if jax.process_index() == 0:
    lock = dirlock.make_lock(workdir, _owner(workdir), heartbeat_s=heartbeat_s,
                             stale_after_s=stale_after_s)
    try:
      if isinstance(lock, dirlock.GcsLock):
        lock.check_bucket()
      fileio.path(workdir).mkdir(parents=True, exist_ok=True)
      _check_links(os.fspath(fileio.path(workdir)))
      lock.acquire(started=time.time(), processes=jax.process_count())
    except errors.UserError as e:  # in use, a link leading nowhere, no bucket
      lock, error = None, e
    except Exception as e:  # pylint: disable=broad-except  (a file, read-only, no bucket)
      lock, error = None, _unusable(workdir, e)
  if jax.process_count() > 1:
    ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if not ok and error is None:
      error = WorkdirLockedError(f"--workdir={workdir} cannot be used or is in use by another "
                                 "job (see process 0's log).")
  if error is not None:
    raise error
  try:
    yield
  finally:
    if lock is not None:
      lock.release()
