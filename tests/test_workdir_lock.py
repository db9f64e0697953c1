"""One writer per workdir: a second job is refused with a clear message, a dead job's lock
is taken over with a message, and (gs://) the lock object works the same on GCS."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import test_train_utils as tu
from tests.gcs_emulator import gcs  # noqa: F401  pylint: disable=unused-import

tu.use_compilation_cache()


def _fresh_start_args(workdir, **overrides):
  """The README job, shrunk: it trains its own vocabulary and prepares the built-in corpus
  in the workdir (what two fresh starts used to race on: `vocab.tmp`)."""
  return tu.main_args(workdir, **{"synthetic_data": False, "build.corpus": None,
                                  "build.vocab_size": 256, "model.vocab_size": None,
                                  "build.num_shards": 2, **overrides})


def test_second_job_is_refused_and_a_dead_jobs_lock_is_taken_over(tmp_path):
  workdir = tmp_path / "w"
  logs = [tmp_path / "a.txt", tmp_path / "b.txt"]
  args = _fresh_start_args(workdir, num_train_steps=100_000, checkpoint_every_steps=100_000)
  procs = []
  for log in logs:  # two fresh starts at once
    with open(log, "w") as f:
      procs.append(subprocess.Popen(args, cwd=tu.REPO, env=tu.env(), stdout=f, stderr=f))
  try:
    deadline = time.time() + 240
    while all(p.poll() is None for p in procs) and time.time() < deadline:
      time.sleep(0.2)
    loser = next(i for i, p in enumerate(procs) if p.poll() is not None)
    winner = procs[1 - loser]
    assert procs[loser].wait() == 2, logs[loser].read_text()[-3000:]
    text = logs[loser].read_text()
    assert f"main.py: error: --workdir={workdir} is in use by process {winner.pid} on host" in text
    assert "or use another --workdir" in text
    assert "Traceback" not in text and "Directory not empty" not in text
    holder = json.loads((workdir / "LOCK").read_text())
    assert holder["pid"] == winner.pid
    # The winner trains on, undisturbed; then it is killed and leaves its lock file behind.
    tu.wait_for(lambda: "step 2/" in logs[1 - loser].read_text(), 240, "step 2", winner)
    assert winner.poll() is None
  finally:
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGKILL)
      p.wait()
  assert (workdir / "LOCK").exists()
  out = tu.run(_fresh_start_args(workdir, num_train_steps=3, checkpoint_every_steps=3))
  assert (f"Took over the lock of --workdir={workdir} from process {winner.pid}" in out.stderr
          and "no longer running" in out.stderr)
  assert tu.checkpoint_steps(workdir) == [3]
  assert not (workdir / "LOCK").exists()  # released at the end


_HOLD = r"""
import sys, time
from bert_jax import workdir_lock
with workdir_lock.hold(sys.argv[1], heartbeat_s=float(sys.argv[2])):
  print("held", flush=True)
  time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


def _hold(workdir, env, heartbeat=60.0, seconds=0.0, **kwargs):
  return subprocess.Popen([sys.executable, "-c", _HOLD, workdir, str(heartbeat), str(seconds)],
                          cwd=tu.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


@pytest.mark.slow
def test_gcs_workdir_lock(gcs):
  """On gs:// (no flock): conditional create, refusal while the holder's heartbeat is
  fresh, takeover from a dead pid on this host, from a stale heartbeat of another host,
  and release on exit."""
  import socket  # pylint: disable=g-import-not-at-top
  workdir = gcs.fresh_prefix()
  env = {**tu.env(), **gcs.env()}
  first = _hold(workdir, env, heartbeat=1.0, seconds=600)
  assert first.stdout.readline().strip() == "held", first.stderr.read()
  time.sleep(2.5)  # a few heartbeats
  second = _hold(workdir, env)
  out, err = second.communicate(timeout=120)
  assert second.returncode != 0 and "held" not in out
  assert f"--workdir={workdir} is in use by process {first.pid} on host" in err
  assert "heartbeat is 0s old" in err or "heartbeat is 1s old" in err, err[-2000:]
  first.send_signal(signal.SIGKILL)
  first.wait()
  third = _hold(workdir, env)
  out, err = third.communicate(timeout=120)
  assert third.returncode == 0 and "released" in out, err[-2000:]
  assert f"from process {first.pid} on host {socket.gethostname()}" in err
  assert "which is no longer running" in err
  assert f"{workdir}/LOCK" not in gcs.list_objects(workdir)  # released
  # Another host's lock: refused while fresh, taken over once its heartbeat is stale.
  other = {"host": "another-host", "pid": 1, "processes": 4, "started": time.time(),
           "heartbeat": time.time()}
  gcs.write_object(f"{workdir}/LOCK", json.dumps(other).encode())
  refused = _hold(workdir, env)
  _, err = refused.communicate(timeout=120)
  assert refused.returncode != 0 and "in use by process 1 on host another-host" in err
  gcs.write_object(f"{workdir}/LOCK", json.dumps({**other, "heartbeat": time.time() - 3600}).encode())
  taken = _hold(workdir, env)
  out, err = taken.communicate(timeout=120)
  assert taken.returncode == 0 and re.search(r"whose heartbeat stopped 36\d\ds ago", err), err[-2000:]


def test_a_workdir_holding_a_symlink_loop_is_one_line(tmp_path):
  """A workdir whose checkpoints/ is a symbolic link to itself (or the workdir a link that
  loops) ended in orbax's FileExistsError traceback (issue 35 item 7): one line naming the
  link, exit 2, nothing written."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "checkpoints").symlink_to("checkpoints")
  proc = subprocess.run(tu.main_args(workdir, synthetic_data=True, num_train_steps=1),
                        cwd=tu.REPO, env=tu.env(1), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"main.py: error: {workdir}/checkpoints is a symbolic link that leads to no directory "
      "(it loops, or its target is gone), inside --workdir where the job writes. Remove the "
      "link or point it at a directory."), proc.stderr[-3000:]
  assert sorted(p.name for p in workdir.iterdir()) == ["checkpoints"]
  (tmp_path / "self").symlink_to("self")
  proc = subprocess.run(tu.main_args(tmp_path / "self", synthetic_data=True, num_train_steps=1),
                        cwd=tu.REPO, env=tu.env(1), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert (f"--workdir={tmp_path / 'self'} cannot be used: it is a symbolic link that leads to "
          "no directory (it loops, or its target is gone)") in proc.stderr.strip().splitlines()[-1]


def test_a_refusal_names_a_holder_that_is_still_writing_its_lock(tmp_path):
  """Two fresh starts at once: the loser can find the winner's lock taken (flock) but its
  JSON not yet written (between flock and pwrite). The refusal must still name the winner,
  never 'process ? on host ?' (seen once in CI)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from common import dirlock  # pylint: disable=g-import-not-at-top
  path = tmp_path / "LOCK"
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, still empty
  writer = threading.Timer(0.3, lambda: os.pwrite(fd, json.dumps(
      {"host": "winner-host", "pid": 4242, "started": time.time()}).encode(), 0))
  writer.start()
  owner = dirlock.Owner("--workdir=W", "Two jobs would collide.", "another --workdir")
  try:
    with pytest.raises(dirlock.LockedError, match="in use by process 4242 on host winner-host"):
      dirlock.LocalLock(str(tmp_path), owner).acquire(started=time.time())
  finally:
    writer.join()
    os.close(fd)
