"""Checkpoints: retention, corrupt-newest fallback, restore onto another mesh, exact
resume after SIGKILL, and SIGTERM (preemption) saving and exiting cleanly."""
import json
import logging
import pathlib
import re
import signal
import subprocess
import time

import flax
import jax
import numpy as np
import pytest

from bert_jax import train
from tests import test_train_utils as tu

tu.use_compilation_cache()


def test_keeps_last_n_plus_periodic(tmp_path):
  config = tu.tiny_config(num_train_steps=9, checkpoint_every_steps=1, keep_checkpoints=2,
                          keep_checkpoint_period=4, log_every_steps=100, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  assert tu.checkpoint_steps(tmp_path) == [4, 8, 9]
  assert int(tu.load_checkpoint(tmp_path, 9)["step"]) == 9
  assert _data_state(tmp_path, 9) == {"process_count": 1, "states": [{"index": 9}]}


def _data_state(workdir, step):
  return json.loads((pathlib.Path(workdir) / "checkpoints" / str(step) / "data" / "metadata")
                    .read_text())


def _corrupt(step_dir: pathlib.Path) -> None:
  """Truncates every data file of the state item (what a bad disk or copy leaves)."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.stat().st_size > 0]
  assert files
  for p in files:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, caplog):
  config = tu.tiny_config(num_train_steps=6, checkpoint_every_steps=3, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  good = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  _corrupt(tmp_path / "checkpoints" / "6")
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(config, str(tmp_path))
  text = caplog.text
  assert f"Checkpoint {tmp_path / 'checkpoints' / '6'} is unreadable" in text
  assert "Resumed from" in text and "/3." in text
  assert (tmp_path / "checkpoints_corrupt" / "6").is_dir()
  # Steps 4-6 were recomputed from step 3, to the very same parameters.
  assert int(state.step) == 6 and tu.checkpoint_steps(tmp_path) == [3, 6]
  again = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  for k in good:
    np.testing.assert_array_equal(good[k], again[k])


def test_all_checkpoints_corrupt_is_an_error_not_a_fresh_start(tmp_path):
  config = tu.tiny_config(num_train_steps=3, checkpoint_every_steps=3, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  _corrupt(tmp_path / "checkpoints" / "3")
  with pytest.raises(RuntimeError, match="No checkpoint .* could be restored"):
    train.train_and_evaluate(config, str(tmp_path))


_SAVE_FSDP_AND_RESHARD = r"""
import jax, numpy as np, sys
from bert_jax import checkpointing, train
from tests import test_train_utils as tu
workdir = sys.argv[1]
config = tu.tiny_config(num_train_steps=4, eval_steps=0)
config.mesh_shape.update(data=2, fsdp=4, tensor=1)
state = train.train_and_evaluate(config, workdir)
kernel = state.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
assert kernel.addressable_shards[0].data.shape == (16, 256), kernel.sharding
# Restore on another 8-device mesh (tensor parallel) and compare.
config.mesh_shape.update(data=1, fsdp=2, tensor=4)
trainer = tu.pretraining_trainer(config)
with trainer.activate():
  ckpt = checkpointing.Checkpointer(workdir, keep=3, keep_period=0)
  step, restored, _, _ = ckpt.restore(trainer.abstract)
k2 = restored.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
assert step == 4, step
assert k2.addressable_shards[0].data.shape == (32, 64)
for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
print("OK")
"""


@pytest.mark.slow
def test_restore_onto_a_different_mesh_and_device_count(tmp_path):
  out = tu.run([tu.sys.executable, "-c", _SAVE_FSDP_AND_RESHARD, str(tmp_path)], devices=8)
  assert "OK" in out.stdout
  # Now one device in this process: resume the 8-device FSDP run and keep training.
  saved = tu.flat(tu.load_checkpoint(tmp_path, 4)["params"])
  config = tu.tiny_config(num_train_steps=5, eval_steps=0)
  state = train.train_and_evaluate(config, str(tmp_path))
  assert int(state.step) == 5
  restored4 = tu.flat(tu.load_checkpoint(tmp_path, 4)["params"])
  for k in saved:
    np.testing.assert_array_equal(saved[k], restored4[k])
  assert jax.device_count() == 1


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
  """A small vocabulary and prepared corpus (the built-in one), shared by the module."""
  from input_pipeline import prepare, vocab  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("corpus")
  vocab_path = vocab.train_vocab("default", str(root / "vocab"), vocab_size=256,
                                 max_chars=300_000)
  prepare.prepare_corpus("default", vocab_path, str(root / "prepared"), num_shards=2,
                         progress=False)
  return {"data.vocab_path": str(root / "vocab"), "data.prepared_dir": str(root / "prepared"),
          "synthetic_data": False, "model.vocab_size": 256}


def _real_data_args(workdir, prepared, **overrides):
  return tu.main_args(workdir, **{**prepared, "num_train_steps": 8, "checkpoint_every_steps": 2,
                                  "keep_checkpoints": 20, "eval_steps": 0, **overrides})


def test_sigkill_then_rerun_gives_bit_identical_training(tmp_path, prepared):
  straight, broken = tmp_path / "straight", tmp_path / "broken"
  tu.run(_real_data_args(straight, prepared))
  ckpt_dir = broken / "checkpoints"

  def kill_when(prefix):
    """Starts the run and kills -9 as soon as a checkpoint `prefix*` starts being written."""
    proc = subprocess.Popen(_real_data_args(broken, prepared), cwd=tu.REPO, env=tu.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      tu.wait_for(lambda: ckpt_dir.is_dir() and any(
          p.name.startswith(prefix) for p in ckpt_dir.iterdir()), 180, prefix, proc)
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()

  kill_when("2")  # mid-save of the first checkpoint: nothing usable yet
  kill_when("4")  # resumed from scratch; killed once step 2 is safe, while 4 is written
  assert 2 in tu.checkpoint_steps(broken) and 8 not in tu.checkpoint_steps(broken)
  tu.run(_real_data_args(broken, prepared))
  a, b = tu.load_checkpoint(straight, 8), tu.load_checkpoint(broken, 8)
  fa, fb = tu.flat(a), tu.flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
  # The data position was restored too (same iterator state at the end).
  assert _data_state(straight, 8) == _data_state(broken, 8)
  assert _data_state(straight, 8)["states"][0]["offset"] > 0


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path, prepared):
  log = tmp_path / "log.txt"
  args = _real_data_args(tmp_path, prepared, num_train_steps=100_000,
                         checkpoint_every_steps=1000)
  with open(log, "w") as f:
    proc = subprocess.Popen(args, cwd=tu.REPO, env=tu.env(), stdout=f, stderr=f)
    tu.wait_for(lambda: "step 3/" in log.read_text(), 180, "step 3", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
  text = log.read_text()
  assert "Preempted" in text
  (step,) = tu.checkpoint_steps(tmp_path)
  assert step >= 3
  out = tu.run(_real_data_args(tmp_path, prepared, num_train_steps=step + 2))
  assert f"Resumed from {tmp_path / 'checkpoints'}/{step}" in out.stderr
  assert tu.checkpoint_steps(tmp_path)[-1] == step + 2


def test_resume_with_another_model_is_refused_and_moves_nothing(tmp_path):
  """A workdir rerun with a model that does not fit its checkpoints (here: NSP switched
  off, or another depth) is a clear error naming the changed fields; the checkpoints are
  valid and stay where they are (never called corrupt, never moved)."""
  config = tu.tiny_config(num_train_steps=2, checkpoint_every_steps=2, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  for change, field in (({"data__nsp": False}, "data.nsp"), ({"model__num_layers": 3}, "model.num_layers")):
    changed = tu.tiny_config(num_train_steps=4, checkpoint_every_steps=2, eval_steps=0, **change)
    with pytest.raises(ValueError, match=f"(?s){field}.*--workdir.*init_checkpoint"):
      train.train_and_evaluate(changed, str(tmp_path))
    assert tu.checkpoint_steps(tmp_path) == [2]
    assert not (tmp_path / "checkpoints_corrupt").exists()
  state = train.train_and_evaluate(tu.tiny_config(num_train_steps=4, checkpoint_every_steps=2,
                                                  eval_steps=0), str(tmp_path))
  assert int(state.step) == 4


def _largest_data_file(step_dir: pathlib.Path) -> pathlib.Path:
  return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
             key=lambda p: p.stat().st_size)


def _overwrite_middle(p: pathlib.Path, byte: int) -> None:
  """Same size, other bytes: what a bad disk, a bad copy or a stray write leaves."""
  data = bytearray(p.read_bytes())
  mid = len(data) // 2
  data[mid:mid + 4096] = bytes([byte]) * len(data[mid:mid + 4096])
  p.write_bytes(bytes(data))


def test_flipped_bytes_are_caught_by_the_checksums(tmp_path, caplog):
  """Bytes changed inside a checkpoint's data file (same size) used to restore silently
  (NaN / 3e38 parameters). The manifest written at save catches them: that step is moved
  aside, the previous one is used, and the rerun recomputes the same parameters."""
  config = tu.tiny_config(num_train_steps=6, checkpoint_every_steps=3, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  good = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  manifest = json.loads((tmp_path / "checkpoints" / "6" / "MANIFEST.json").read_text())
  assert any(name.startswith("state/") for name in manifest["files"])
  victim = _largest_data_file(tmp_path / "checkpoints" / "6")
  _overwrite_middle(victim, 0x7F)
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(config, str(tmp_path))
  assert "differ from the checksums written when it was saved" in caplog.text
  assert "checksum differs" in caplog.text and victim.name in caplog.text
  assert "Resumed from" in caplog.text and "/3." in caplog.text
  assert (tmp_path / "checkpoints_corrupt" / "6").is_dir()
  assert int(state.step) == 6
  again = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  for k in good:
    np.testing.assert_array_equal(good[k], again[k])


def _abstract_state(config):
  """The pre-training TrainState's ShapeDtypeStructs (with shardings) of `config`."""
  return tu.pretraining_trainer(config).abstract


def test_non_finite_restored_state_is_damaged_even_without_checksums(tmp_path, caplog):
  """A checkpoint without a manifest (an older version's, or one killed before it was
  written) that holds NaN is not resumed from: it used to end every rerun with a NaN-loss
  error blaming the learning rate."""
  from bert_jax import checkpointing  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(num_train_steps=6, checkpoint_every_steps=3, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=5, keep_period=0)
  step, state, data_state, _ = ckpt.restore(_abstract_state(config), config)
  poisoned = state.replace(step=state.step + 3, params=jax.tree.map(
      lambda x: x.at[(0,) * x.ndim].set(np.nan), state.params))
  ckpt.save(9, poisoned, data_state, config)
  ckpt.close()
  (tmp_path / "checkpoints" / "9" / "MANIFEST.json").unlink()
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(tu.tiny_config(num_train_steps=9, checkpoint_every_steps=3,
                                                  eval_steps=0), str(tmp_path))
  assert "holds NaN or infinite parameters" in caplog.text
  assert "Resumed from" in caplog.text and "/6." in caplog.text
  assert (tmp_path / "checkpoints_corrupt" / "9").is_dir() and step == 6
  assert int(state.step) == 9
  assert all(np.isfinite(v).all() for v in tu.flat(tu.load_checkpoint(tmp_path, 9)["params"]).values())


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_scan_layers_change_on_resume_converts_the_layout(tmp_path, caplog):
  """Only the layout changed (model.scan_layers): the checkpoint is converted on load and
  training continues; nothing is called corrupt or moved, and the restored state is the
  saved one, bit for bit, in the other layout (params and Adam moments)."""
  from bert_jax import checkpointing, loader  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(num_train_steps=2, checkpoint_every_steps=2, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  saved = tu.load_checkpoint(tmp_path, 2)
  scanned = tu.tiny_config(num_train_steps=2, model__scan_layers=True)
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=3, keep_period=0)
  step, restored, _, _ = ckpt.restore(_abstract_state(scanned), scanned)
  ckpt.close()
  assert step == 2
  assert "layers" in restored.params["bert"]["encoder"]
  unrolled = loader.relayout(jax.device_get(restored), False)
  index = lambda k: re.sub(r"\['(\d+)'\]", r"[\1]", k)  # tuple fields: '1' vs 1
  got = {index(k): v for k, v in tu.flat(flax.serialization.to_state_dict(unrolled)).items()}
  want = tu.flat(saved)
  assert got.keys() == want.keys() and len(got) > 100  # params and both moments
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  caplog.set_level(logging.INFO)
  state = train.train_and_evaluate(tu.tiny_config(num_train_steps=4, checkpoint_every_steps=2,
                                                  eval_steps=0, model__scan_layers=True),
                                   str(tmp_path))
  assert int(state.step) == 4 and "Converting the checkpoint's layers" in caplog.text
  assert not (tmp_path / "checkpoints_corrupt").exists()
  assert loader.saved_param_shapes(str(tmp_path / "checkpoints" / "4"))
  # And back, with the other layout knobs changed too (remat, compute dtype): the unrolled
  # config resumes the scanned checkpoint of step 4.
  state = train.train_and_evaluate(tu.tiny_config(num_train_steps=5, checkpoint_every_steps=2,
                                                  eval_steps=0, model__remat="full",
                                                  model__dtype="bfloat16"), str(tmp_path))
  assert int(state.step) == 5 and tu.checkpoint_steps(tmp_path)[-2:] == [4, 5]


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MiB tmpfs (root only; skips where mounting is not permitted)."""
  disk = tmp_path / "disk"
  disk.mkdir()
  mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                         capture_output=True, text=True, check=False)
  if mount.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
  try:
    yield disk
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_clear_line(small_disk):
  """The disk fills up during the third save: one line says so (not ~1,800 lines of
  asynchronous tracebacks), the exit status is non-zero, the earlier checkpoints are
  intact (their checksums match) and, with space again, the rerun continues from them."""
  from common import fileio  # pylint: disable=g-import-not-at-top
  workdir = small_disk / "w"
  args = tu.main_args(workdir, num_train_steps=20, checkpoint_every_steps=2, keep_checkpoints=100)
  out = subprocess.run(args, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 2, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines()
            if "error:" in l.lower() or re.match(r"E\d{4} ", l) or "Error" in l]
  assert len(errors) == 1 and errors[0].startswith("main.py: error: Saving checkpoint "), errors
  assert "no space left on device" in errors[0] and "rerun the same command" in errors[0]
  assert "Traceback" not in out.stderr and "sys.meta_path" not in out.stderr
  assert "never awaited" not in out.stderr and "never retrieved" not in out.stderr
  steps = tu.checkpoint_steps(workdir)
  assert steps and steps == list(range(2, 2 * len(steps) + 1, 2)), steps
  assert f"latest complete: step {steps[-1]}" in errors[0]
  for step in steps:
    assert fileio.verify_manifest(workdir / "checkpoints" / str(step)) == []
  subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
  out = tu.run(args)
  assert f"Resumed from {workdir / 'checkpoints'}/{steps[-1]}" in out.stderr
  assert tu.checkpoint_steps(workdir)[-1] == 20


@pytest.mark.slow
def test_kill_during_the_final_evaluation_evaluates_on_rerun(tmp_path):
  """SIGKILL while the last step's evaluation runs: the rerun must not say "Training
  already reached step N" and skip it; the final evaluation is done (and in TensorBoard)."""
  log = tmp_path / "log.txt"
  args = lambda eval_steps: tu.main_args(tmp_path / "w", num_train_steps=4,
                                        checkpoint_every_steps=2, eval_steps=eval_steps)
  with open(log, "w") as f:
    proc = subprocess.Popen(args(6000), cwd=tu.REPO, env=tu.env(), stdout=f, stderr=f)
    try:
      tu.wait_for(lambda: "step 4/4" in log.read_text(), 180, "step 4/4", proc)
      time.sleep(1)  # long enough for a save of step 4 started before the evaluation to land
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
  assert "eval at step 4" not in log.read_text()  # killed mid-evaluation
  out = tu.run(args(50))
  assert "Training already reached step 4" not in out.stderr
  assert "eval at step 4" in out.stderr
  assert 4 in tu.read_scalars(tmp_path / "w", "eval/loss")
  assert tu.checkpoint_steps(tmp_path / "w")[-1] == 4


def test_sigkill_after_a_completed_save_resumes_verified(tmp_path):
  """The newest checkpoint's checksums used to be written only when the next save began,
  so after kill -9 the rerun always restored it unverified. Now they are written as soon as
  its save completes: killed while the last step's long evaluation runs (checkpoint 2 done,
  none begun since), the rerun says checkpoint 2 was verified."""
  log = tmp_path / "log.txt"
  workdir = tmp_path / "w"
  args = lambda eval_steps: tu.main_args(workdir, num_train_steps=4, checkpoint_every_steps=2,
                                        eval_steps=eval_steps)
  manifest = workdir / "checkpoints" / "2" / "MANIFEST.json"
  with open(log, "w") as f:
    proc = subprocess.Popen(args(100_000), cwd=tu.REPO, env=tu.env(), stdout=f, stderr=f)
    try:
      tu.wait_for(lambda: "step 4/4" in log.read_text(), 180, "step 4/4", proc)
      deadline = time.time() + 20  # the save of step 2 is long done: its checksums follow it
      while not manifest.exists() and time.time() < deadline:
        time.sleep(0.05)
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
  assert "eval at step 4" not in log.read_text() and tu.checkpoint_steps(workdir) == [2]
  assert manifest.exists(), "checkpoint 2 complete, its checksums still not written"
  out = tu.run(args(0))
  assert f"Checkpoint {workdir / 'checkpoints' / '2'} verified" in out.stderr, out.stderr[-3000:]
  assert "unverified" not in out.stderr
  assert f"Resumed from {workdir / 'checkpoints'}/2." in out.stderr


def test_a_checkpoint_without_checksums_is_not_blamed_on_an_older_version(tmp_path, caplog):
  """A checkpoint of this version lacking MANIFEST.json (the job was killed between the end
  of its save and the checksums) is restored unverified with that said, not blamed on "an
  older version"; one whose saved config predates checksums at save says so."""
  from bert_jax import checkpointing  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(num_train_steps=3, checkpoint_every_steps=3, eval_steps=0)
  train.train_and_evaluate(config, str(tmp_path))
  step_dir = tmp_path / "checkpoints" / "3"
  (step_dir / "MANIFEST.json").unlink()
  caplog.set_level(logging.INFO)
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=5, keep_period=0)
  assert ckpt.restore(_abstract_state(config), config)[0] == 3
  ckpt.close()
  assert "restored unverified" in caplog.text and "older version" not in caplog.text
  assert "stopped after its save completed, before its checksums were written" in caplog.text
  # A checkpoint whose config lacks the mark (saved before checksums followed each save).
  metadata = step_dir / "config" / "metadata"
  saved = json.loads(metadata.read_text())
  del saved[checkpointing.CHECKSUMS_KEY]
  metadata.write_text(json.dumps(saved))
  caplog.clear()
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=5, keep_period=0)
  assert ckpt.restore(_abstract_state(config), config)[0] == 3
  ckpt.close()
  assert "earlier version of bert_jax" in caplog.text and "restored unverified" in caplog.text
