"""Two processes (hosts) on loopback: each feeds half of the global batch, training matches
one process with the same global batch; a dead peer fails the job instead of hanging.

Every process is a subprocess with a timeout: a JAX process whose peer never shows up
aborts (SIGABRT) rather than raising."""
import json
import socket
import subprocess
import time

import numpy as np
import pytest

from tests import test_train_utils as tu


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, port, process_id, log, **overrides):
  return start_process(tu.main_args(workdir, **overrides), port, process_id, log)


def start_process(args, port, process_id, log):
  """`args` as process `process_id` of 2 on loopback (1 device each)."""
  args = args + ["--num_processes=2", f"--process_id={process_id}",
                 f"--coordinator_address=127.0.0.1:{port}", "--heartbeat_timeout=10",
                 "--distributed_init_timeout=60"]
  return subprocess.Popen(args, cwd=tu.REPO, env=tu.env(devices=1), stdout=log, stderr=log)


def run_two_processes(args, log_dir, timeout=300) -> None:
  """Runs `args` as 2 processes on loopback; fails with both logs unless both exit 0."""
  port = _free_port()
  logs = [open(log_dir / f"log{i}.txt", "w") for i in range(2)]
  procs = [start_process(args, port, i, logs[i]) for i in range(2)]
  try:
    codes = [p.wait(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for f in logs:
      f.close()
  assert codes == [0, 0], [(log_dir / f"log{i}.txt").read_text()[-3000:] for i in range(2)]


@pytest.mark.slow  # ~45 s: two processes (CI runs the slow tier)
def test_two_processes_match_one_process(tmp_path):
  overrides = dict(num_train_steps=4, checkpoint_every_steps=4)
  single = tmp_path / "single"
  tu.run(tu.main_args(single, **overrides), devices=2)  # one process, two devices
  multi = tmp_path / "multi"
  run_two_processes(tu.main_args(multi, **overrides), tmp_path, timeout=240)
  log0 = (tmp_path / "log0.txt").read_text()
  assert "JAX process 0/2" in log0 and "2 devices in total" in log0
  a = tu.read_scalars(single, "train/loss")
  b = tu.read_scalars(multi, "train/loss")
  assert sorted(a) == sorted(b) == [1, 2, 3, 4]
  for step in a:
    assert b[step] == a[step]  # two 1-device hosts == one 2-device host, bit for bit
  pa, pb = tu.flat(tu.load_checkpoint(single, 4)), tu.flat(tu.load_checkpoint(multi, 4))
  for k in pa:
    np.testing.assert_array_equal(pb[k], pa[k], err_msg=k)
  # Each host recorded its own input position.
  state = json.loads((multi / "checkpoints" / "4" / "data" / "metadata").read_text())
  assert state["process_count"] == 2 and len(state["states"]) == 2


@pytest.mark.slow
def test_dead_peer_makes_the_other_process_exit(tmp_path):
  port = _free_port()
  logs = [open(tmp_path / f"log{i}.txt", "w") for i in range(2)]
  overrides = dict(num_train_steps=1_000_000, checkpoint_every_steps=1_000_000,
                   log_every_steps=1)
  procs = [_start(tmp_path / "w", port, i, logs[i], **overrides) for i in range(2)]
  try:
    tu.wait_for(lambda: "step 2/" in (tmp_path / "log0.txt").read_text(), 180, "training",
                procs[0])
    procs[1].kill()
    start = time.time()
    code = procs[0].wait(timeout=150)
    elapsed = time.time() - start
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for f in logs:
      f.close()
  assert code != 0
  assert elapsed < 150
