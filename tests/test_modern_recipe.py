"""ModernBERT's pre-training recipe knobs (configs/modern_pretrain.py), each tested: the
masking rate (30%, held-out at 15%) and its schedule, the warmup-stable-decay schedule with
its decay started from a mid-run checkpoint, StableAdamW's update clipping, a context
extension (longer sequences, new rope theta) from a checkpoint, and kill/resume
bit-identical across those phase boundaries."""
from __future__ import annotations

import signal
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import loader, optim, train
from bert_jax.configs import modern_pretrain
from input_pipeline import pretrain as pretrain_data
from tests import test_train_utils as tu
from tests.test_checkpoint import prepared  # noqa: F401  pylint: disable=unused-import

tu.use_compilation_cache()

# configs/modern_pretrain.py:modernbert-tiny shrunk to seconds-long runs.
SMALL = {**tu.TINY, "model.num_layers": 3, "model.local_window": 8,
         "data.max_predictions_per_seq": 10, "data.packing": False}


def _config(**overrides):
  c = modern_pretrain.get_config("modernbert-tiny")
  for key, value in {**SMALL, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def _lr(config, step, total):
  return optim.host_learning_rate(config, step, total)


def test_wsd_schedule_warms_up_holds_then_cools_down():
  c = _config(num_train_steps=100, **{"schedule.warmup_steps": 10, "schedule.decay_steps": 20,
                                      "opt.learning_rate": 1.0})
  assert _lr(c, 5, 100) == pytest.approx(0.5)
  assert _lr(c, 10, 100) == _lr(c, 50, 100) == _lr(c, 80, 100) == 1.0
  assert _lr(c, 85, 100) == pytest.approx(1 - np.sqrt(5 / 20), rel=1e-6)  # 1-sqrt
  assert _lr(c, 100, 100) == pytest.approx(0.0, abs=1e-7)
  c.schedule.decay_shape = "linear"
  assert _lr(c, 90, 100) == pytest.approx(0.5, rel=1e-6)
  c.schedule.decay_start = 30  # the decay moved earlier: stable until 30, zero at 50
  assert _lr(c, 29, 100) == 1.0 and _lr(c, 40, 100) == pytest.approx(0.5, rel=1e-6)
  assert _lr(c, 60, 100) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.slow
def test_decay_started_from_a_mid_run_checkpoint_equals_a_planned_one(tmp_path):
  # Planned: 8 steps, the decay over the last 4. Unplanned: 4 stable steps (no decay yet),
  # then the workdir rerun with the decay starting at its checkpoint: the same weights.
  planned = _config(num_train_steps=8, checkpoint_every_steps=4,
                    **{"schedule.decay_steps": 4, "schedule.warmup_steps": 2})
  train.train_and_evaluate(planned, str(tmp_path / "planned"))
  stable = _config(num_train_steps=4, checkpoint_every_steps=4,
                   **{"schedule.decay_steps": 0, "schedule.warmup_steps": 2})
  train.train_and_evaluate(stable, str(tmp_path / "later"))
  cool = _config(num_train_steps=8, checkpoint_every_steps=4,
                 **{"schedule.decay_steps": 4, "schedule.decay_start": 4,
                    "schedule.warmup_steps": 2})
  train.train_and_evaluate(cool, str(tmp_path / "later"))
  a, b = tu.flat(tu.load_checkpoint(tmp_path / "planned", 8)), tu.flat(
      tu.load_checkpoint(tmp_path / "later", 8))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert _lr(cool, 6, 8) < _lr(stable, 3, 4)


def test_stableadamw_clips_each_tensors_update_to_unit_rms():
  c = _config(**{"opt.weight_decay": 0.0, "opt.grad_clip_norm": 0.0, "opt.learning_rate": 1.0,
                 "opt.b2": 0.999, "opt.bias_correction": False,
                 "schedule.kind": "linear", "schedule.warmup_steps": 0,
                 "schedule.decay_steps": 1000})
  params = {"a": jnp.ones((4, 4)), "b": jnp.ones((3,))}
  tx = optim.make_optimizer(c, total_steps=1000)
  state = tx.init(params)
  # After a quiet history, a gradient spike makes Adam's update m / sqrt(v) about
  # (1 - b1) / sqrt(1 - b2) = 3 (v lags behind m): plain AdamW's RMS exceeds 1, StableAdamW
  # clips that tensor's update to RMS 1 (and leaves the quiet tensor as it is).
  quiet = {"a": jnp.full((4, 4), 1e-3), "b": jnp.full((3,), 1e-3)}
  for _ in range(20):
    _, state = tx.update(quiet, state, params)
  spike = {"a": jnp.full((4, 4), 10.0), "b": quiet["b"]}
  updates, _ = tx.update(spike, state, params)
  rms = lambda x: float(jnp.sqrt(jnp.mean(jnp.square(x))))
  lr = _lr(c, 20, 1000)
  assert rms(updates["a"]) == pytest.approx(lr, rel=1e-5)
  assert rms(updates["b"]) == pytest.approx(lr, rel=1e-5)  # steady: Adam's own RMS 1
  c.opt.name = "adamw"
  plain = optim.make_optimizer(c, total_steps=1000)
  pstate = plain.init(params)
  for _ in range(20):
    _, pstate = plain.update(quiet, pstate, params)
  assert rms(plain.update(spike, pstate, params)[0]["a"]) > 2.5
  assert isinstance(tx, optax.GradientTransformation)


def _masked_share(data_cfg, split, n=4):
  it = pretrain_data.PretrainIterator(data_cfg, batch_size=16, seed=0, process_index=0,
                                     process_count=1, split=split)
  weights, tokens = 0.0, 0.0
  for _ in range(n):
    b = next(it)
    weights += float(b["masked_lm_weights"].sum())
    tokens += float((b["input_mask"].sum(1) - 2).sum())
  return weights / tokens


def test_masking_rate_30_percent_evaluated_at_15_and_its_schedule(prepared):  # noqa: F811
  c = _config(**{**prepared, "data.max_seq_length": 64, "data.max_predictions_per_seq": 40,
                 "data.eval_fraction": 0.2})
  data_cfg = c.data
  data_cfg.prepared_dir, data_cfg.vocab_path = prepared["data.prepared_dir"], prepared["data.vocab_path"]
  assert _masked_share(data_cfg, "train") == pytest.approx(0.30, abs=0.02)
  assert _masked_share(data_cfg, "eval") == pytest.approx(0.15, abs=0.02)
  # From 30% down to 15% over the first 2 blocks of each host.
  data_cfg.masked_lm_prob_final, data_cfg.masked_lm_prob_blocks = 0.15, 2
  it_rates = [_rate(data_cfg, e, b) for e, b in ((0, 0), (0, 1), (0, 2), (3, 0))]
  assert it_rates == pytest.approx([0.30, 0.225, 0.15, 0.15])


def _rate(data_cfg, epoch, block):
  """BlockStream.masking_rate without a corpus (it reads only the config and the block)."""
  s = pretrain_data.BlockStream.__new__(pretrain_data.BlockStream)
  s.cfg, s.split_id, s.blocks_per_epoch = data_cfg, 0, 100
  return s.masking_rate(epoch, block)


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_context_extension_from_a_checkpoint_keeps_the_weights(tmp_path):
  c = _config(num_train_steps=4, checkpoint_every_steps=4)
  train.train_and_evaluate(c, str(tmp_path))
  before = tu.flat(tu.load_checkpoint(tmp_path, 4)["params"])
  longer = _config(num_train_steps=6, checkpoint_every_steps=6,
                   **{"data.max_seq_length": 64, "model.max_position_embeddings": 64,
                      "model.rope_theta": 320000.0})
  train.train_and_evaluate(longer, str(tmp_path))
  cfg, _ = loader.read(str(tmp_path))
  assert cfg.rope_theta == 320000.0 and cfg.max_position_embeddings == 64
  after = tu.flat(tu.load_checkpoint(tmp_path, 6)["params"])
  assert before.keys() == after.keys()
  assert any(not np.array_equal(before[k], after[k]) for k in before)  # it trained on


@pytest.mark.slow
def test_kill_then_rerun_is_bit_identical_across_phase_boundaries(tmp_path, prepared):  # noqa: F811
  """Phase 1 (stable lr, L=32) to step 4; phase 2 (L=64, new rope theta, the decay from its
  start) to step 8. The broken run is killed -9 right after each phase's first checkpoint
  (4, then 6) and rerun: its step-8 weights and data position equal the straight run's."""
  common = {**prepared, "data.packing": True, "keep_checkpoints": 20,
            "checkpoint_every_steps": 2, "eval_steps": 0}
  phase1 = dict(common, num_train_steps=4, **{"schedule.decay_steps": 0})
  phase2 = dict(common, num_train_steps=8, **{"schedule.decay_steps": 4,
                                             "schedule.decay_start": 4,
                                             "data.max_seq_length": 64,
                                             "model.max_position_embeddings": 64,
                                             "model.rope_theta": 320000.0})
  args = lambda workdir, phase: tu.main_args(workdir, config="configs/modern_pretrain.py",
                                             **{**SMALL, **phase})
  straight, broken = tmp_path / "straight", tmp_path / "broken"
  tu.run(args(straight, phase1))
  tu.run(args(straight, phase2))

  def kill_after(phase, step):
    proc = subprocess.Popen(args(broken, phase), cwd=tu.REPO, env=tu.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      tu.wait_for(lambda: step in tu.checkpoint_steps(broken), 300, str(step), proc)
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()

  kill_after(phase1, 2)
  tu.run(args(broken, phase1))
  kill_after(phase2, 6)
  tu.run(args(broken, phase2))
  a, b = tu.flat(tu.load_checkpoint(straight, 8)), tu.flat(tu.load_checkpoint(broken, 8))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert jax.device_count() >= 1
