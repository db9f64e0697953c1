"""The train step and optimizers on one device: learning, accumulation, decay mask,
LAMB, FLOPs accounting, NaN stop, the in-process entry point."""
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from input_pipeline import pretrain as pretrain_data
from input_pipeline import synthetic
from bert_jax import flops as flops_lib
from bert_jax import metrics as metrics_lib
from bert_jax import optim
from bert_jax import registry
from bert_jax import train
from bert_jax import trainer as trainer_lib
from tests import test_train_utils as tu

tu.use_compilation_cache()


def _setup(config):
  """(trainer of the pre-training model on one device, its initial state)."""
  trainer = tu.pretraining_trainer(config, devices=jax.devices()[:1])
  with trainer.activate():
    state = trainer.init()
  return trainer, state


def _batches(config, n, seed=0):
  it = synthetic.SyntheticIterator(
      batch_size=config.global_batch_size, seq_len=config.data.max_seq_length,
      num_predictions=config.data.max_predictions_per_seq, vocab_size=config.model.vocab_size,
      seed=seed)
  return [next(it) for _ in range(n)]


def _run_steps(config, batches, micro_steps=1, state=None):
  config = config.copy_and_resolve_references()
  config.grad_accum_steps = micro_steps
  trainer, start = _setup(config)
  state = start if state is None else state
  out = []
  with trainer.activate():
    for b in batches:
      state, m = trainer.train_step(state, trainer.to_global(b), jax.random.key(0))
      out.append(jax.device_get(m))
  return state, out


def test_train_step_learns_a_fixed_batch():
  config = tu.tiny_config(opt__learning_rate=1e-2, schedule__warmup_steps=1,
                          model__hidden_dropout_rate=0.0, model__attention_dropout_rate=0.0)
  batch = _batches(config, 1)[0]
  state, metrics = _run_steps(config, [batch] * 15)
  assert int(state.step) == 15
  assert metrics[-1]["loss"] < 0.8 * metrics[0]["loss"]
  assert metrics[0]["mlm_weight"] == batch["masked_lm_weights"].sum()
  assert metrics[0]["num_examples"] == config.global_batch_size
  # bfloat16 compute: master weights and optimizer moments stay float32.
  config.model.dtype = "bfloat16"
  state, metrics = _run_steps(config, [batch] * 3)
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
  assert moments and {x.dtype for x in moments} == {jnp.dtype("float32")}
  assert metrics[-1]["loss"] < metrics[0]["loss"]


def test_scanned_rematerialised_layers_train_like_unrolled_ones():
  """scan_layers + remat change memory and compile time, not the math."""
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(model__hidden_dropout_rate=0.0, model__attention_dropout_rate=0.0)
  batches = _batches(config, 2)
  unrolled, m1 = _run_steps(config, batches)
  scanned_cfg = tu.tiny_config(model__hidden_dropout_rate=0.0, model__attention_dropout_rate=0.0,
                               model__scan_layers=True, model__remat="full")
  _, scanned = _setup(scanned_cfg)
  _, start = _setup(config)  # the unrolled initial params, stacked
  state = scanned.replace(params=jax.tree.map(
      jnp.asarray, loader.to_layout(jax.device_get(start.params), True)))
  state, m2 = _run_steps(scanned_cfg, batches, state=state)
  for m, ref in zip(m2, m1):
    np.testing.assert_allclose(m["loss"], ref["loss"], rtol=1e-5)
  stacked = loader.to_layout(jax.device_get(unrolled.params), True)
  for a, b in zip(jax.tree.leaves(stacked), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_gradient_accumulation_equals_the_big_batch():
  config = tu.tiny_config(model__hidden_dropout_rate=0.0, model__attention_dropout_rate=0.0,
                          global_batch_size=16)
  batches = _batches(config, 2)
  # Uneven MLM weights across micro-batches: the normalisation must be global.
  batches[0]["masked_lm_weights"][:4] = 0.0
  full, m_full = _run_steps(config, batches, micro_steps=1)
  acc, m_acc = _run_steps(config, batches, micro_steps=4)
  for a, b in zip(m_full, m_acc):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)
    assert a["mlm_correct_sum"] == b["mlm_correct_sum"]
  for x, y in zip(jax.tree.leaves(full.params), jax.tree.leaves(acc.params)):
    np.testing.assert_allclose(x, y, atol=2e-6, rtol=1e-4)


def test_weight_decay_mask_skips_layernorm_and_biases():
  config = tu.tiny_config()
  _, state = _setup(config)
  mask = tu.flat(optim.weight_decay_mask(state.params))
  decayed = sorted(k for k, v in mask.items() if v)
  skipped = sorted(k for k, v in mask.items() if not v)
  assert all("kernel" in k or "embedding" in k for k in decayed)
  assert all("LayerNorm" in k or "bias" in k for k in skipped)
  assert any("output_bias" in k for k in skipped)
  assert any("word_embeddings" in k for k in decayed)
  assert len(decayed) + len(skipped) == len(mask)


def test_adamw_matches_bert_and_decay_spares_masked_params():
  """One update by hand (BERT's AdamWeightDecayOptimizer: no bias correction)."""
  config = tu.tiny_config(opt__learning_rate=0.1, schedule__warmup_steps=0,
                          opt__grad_clip_norm=0.0, opt__bias_correction=False)
  tx = optim.make_optimizer(config)
  params = {"dense": {"kernel": jnp.full((2, 2), 2.0), "bias": jnp.full((2,), 2.0)},
            "LayerNorm": {"scale": jnp.full((2,), 2.0)}}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  state = tx.init(params)
  for _ in range(2):
    updates, state = tx.update(grads, state, params)
  lr = optim.host_learning_rate(config, 1)
  m = 0.1 * 0.5 * (1 + 0.9)  # two steps of m = b1 m + (1 - b1) g
  v = 0.001 * 0.25 * (1 + 0.999)
  adam = m / (np.sqrt(v) + 1e-6)
  np.testing.assert_allclose(updates["dense"]["kernel"], -lr * (adam + 0.01 * 2.0), rtol=1e-5)
  np.testing.assert_allclose(updates["dense"]["bias"], -lr * adam, rtol=1e-5)
  np.testing.assert_allclose(updates["LayerNorm"]["scale"], -lr * adam, rtol=1e-5)


def test_lamb_matches_optax_lamb():
  config = tu.tiny_config(opt__name="lamb", opt__bias_correction=True, opt__grad_clip_norm=0.0,
                          schedule__warmup_steps=0, opt__learning_rate=1e-2)
  ours = optim.make_optimizer(config)
  ref = optax.lamb(optim.schedule_from_config(config), b1=0.9, b2=0.999, eps=1e-6,
                   weight_decay=0.01, mask=optim.weight_decay_mask)
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
                      "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}
  s1, s2 = ours.init(params), ref.init(params)
  for i in range(3):
    g = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    u1, s1 = ours.update(g, s1, params)
    u2, s2 = ref.update(g, s2, params)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
    params = optax.apply_updates(params, u1)


def test_learning_rate_schedule_warmup_then_linear_decay():
  sched = optim.learning_rate_schedule(1e-4, 10, 110)
  np.testing.assert_allclose([sched(0), sched(5), sched(10), sched(60), sched(110)],
                             [0.0, 5e-5, 1e-4, 5e-5, 0.0], atol=1e-12)


def test_analytic_flops_match_xla_cost_analysis():
  """Analytic model FLOPs vs XLA's count for the compiled train step (within 10%)."""
  config = tu.tiny_config(model__hidden_size=256, model__num_heads=4, model__vocab_size=2048,
                          model__max_position_embeddings=128, data__max_seq_length=128,
                          data__max_predictions_per_seq=20, model__hidden_dropout_rate=0.0,
                          model__attention_dropout_rate=0.0)
  trainer, state = _setup(config)
  batch = trainer.to_global(_batches(config, 1)[0])
  with trainer.activate():
    compiled = trainer.train_step.lower(state, batch, jax.random.key(0)).compile()
  xla = flops_lib.xla_flops(compiled)
  # The last layer runs at the 20 masked positions and [CLS] only (model.BertForPreTraining's
  # head_rows): what the objective counts, and XLA executes.
  analytic = flops_lib.train_flops_per_step(registry.model_config(config), 8, 128, 20,
                                            last_rows=21)
  shapes = {k: tuple(v.shape) for k, v in batch.items()}
  assert trainer.objective.flops(trainer.model, shapes) == analytic
  assert analytic < flops_lib.train_flops_per_step(registry.model_config(config), 8, 128, 20)
  assert 0.9 < analytic / xla < 1.1, (analytic, xla)


def test_peak_flops_table_and_cpu_probe():
  assert flops_lib.PEAK_BF16_FLOPS["TPU v4"] == 275e12
  assert flops_lib.peak_flops(override=1e12) == 1e12 * jax.device_count()
  assert flops_lib.peak_flops("float32") > 1e9  # measured on this CPU (cached)


def test_entry_point_trains_evaluates_and_stops_on_nan(tmp_path):
  config = tu.tiny_config(eval_steps=2, num_train_steps=4, checkpoint_every_steps=2,
                          max_steps_per_run=3)
  state = train.train_and_evaluate(config, str(tmp_path))  # stops early, with a checkpoint
  assert int(state.step) == 3 and tu.checkpoint_steps(tmp_path) == [2, 3]
  state = train.train_and_evaluate(config, str(tmp_path))
  assert int(state.step) == 4 and tu.checkpoint_steps(tmp_path) == [3, 4]  # keeps 2
  assert set(tu.read_scalars(tmp_path, "train/loss")) == {1, 2, 3, 4}
  assert set(tu.read_scalars(tmp_path, "eval/nsp_accuracy")) == {4}
  # Continue with an absurd learning rate: the run stops at the first bad step, says so,
  # and never checkpoints the broken state.
  config.num_train_steps = 8
  config.opt.learning_rate = 1e30
  config.schedule.warmup_steps = 0
  with pytest.raises(metrics_lib.NonFiniteLossError, match="at training step 5"):
    train.train_and_evaluate(config, str(tmp_path))
  assert tu.checkpoint_steps(tmp_path) == [3, 4]


class _Fixed:
  """Fixed host batches, with the get_state() trainer.run saves beside each checkpoint."""

  def __init__(self, batches):
    self.batches = iter(batches)

  def __next__(self):
    return next(self.batches)

  def get_state(self):
    return {}


def _run_job_steps(config, workdir, batches, ahead=None):
  """(trainer, state) after trainer.run over `batches`, the train step compiled ahead for
  `ahead` (batch shapes) when given."""
  trainer = tu.pretraining_trainer(config, workdir=str(workdir))
  if ahead is not None:
    trainer.compile_ahead(ahead)
  state, _ = trainer.restore_or_init()
  return trainer, trainer_lib.run(trainer, state, _Fixed(batches), num_steps=len(batches)).state


def test_train_step_compiled_ahead_is_used_and_trains_identically(tmp_path):
  config = tu.tiny_config(num_train_steps=3, checkpoint_every_steps=0)
  batches = _batches(config, 3)
  shapes = pretrain_data.batch_shapes(config.data, config.global_batch_size)
  assert {k: (v.shape, v.dtype) for k, v in batches[0].items()} == shapes
  ref_trainer, ref = _run_job_steps(config, tmp_path / "jit", batches)
  trainer, state = _run_job_steps(config, tmp_path / "ahead", batches, ahead=shapes)
  # The run stepped with the program compiled ahead: the jitted step never compiled.
  assert ref_trainer.train_step._cache_size() == 1 and trainer.train_step._cache_size() == 0
  assert int(state.step) == 3
  for k, v in tu.flat(ref.params).items():
    np.testing.assert_array_equal(tu.flat(state.params)[k], v, err_msg=k)


def test_a_job_that_ends_while_the_step_compiles_ahead_exits_cleanly(tmp_path):
  # A job that ends before its first step (a rerun with nothing left to train, an error)
  # while compile_ahead's thread is still compiling must exit normally, not abort in XLA.
  code = f"""
import jax
jax.config.update("jax_enable_compilation_cache", False)  # really compiling at exit
from tests import test_train_utils as tu
from input_pipeline import pretrain as pretrain_data
config = tu.tiny_config()
trainer = tu.pretraining_trainer(config, workdir={str(tmp_path)!r})
trainer.compile_ahead(pretrain_data.batch_shapes(config.data, config.global_batch_size))
import time
time.sleep(2)  # past the tracing: XLA compiling, without the GIL, when the process ends
print("ending", "compiled" if trainer._ahead[1] else "compiling")
"""
  proc = tu.run([sys.executable, "-c", code], check=False)
  assert proc.returncode == 0 and "ending" in proc.stdout, proc.stderr[-3000:]
  if "compiling" not in proc.stdout:
    pytest.skip("the tiny step compiled within 2 s on this machine: nothing in flight at exit")


def test_a_failed_compile_ahead_falls_back_or_raises_its_error():
  config = tu.tiny_config()

  class Unlowerable:
    def lower(self, *args):
      raise ValueError("no program for these shapes")

  trainer = dataclasses.replace(tu.pretraining_trainer(config, workdir=None),
                                train_step=Unlowerable())
  shapes = pretrain_data.batch_shapes(config.data, config.global_batch_size)
  trainer.compile_ahead(shapes)
  assert trainer.compiled_ahead() is None  # the job's way: the jitted step compiles instead
  trainer.compile_ahead(shapes)
  with pytest.raises(ValueError, match="no program for these shapes"):  # a benchmark's
    trainer.compiled_ahead(fallback=False)
  assert trainer.compiled_ahead(fallback=False) is None  # once


@pytest.mark.slow  # three more compilations of the tiny step (~10 s)
def test_train_step_compiled_ahead_for_other_batches_falls_back_to_jit(tmp_path):
  config = tu.tiny_config(num_train_steps=3, checkpoint_every_steps=0)
  batches = _batches(config, 3)
  shapes = pretrain_data.batch_shapes(config.data, config.global_batch_size)
  _, ref = _run_job_steps(config, tmp_path / "jit", batches)
  # Compiled for other batches (twice the rows): the run steps with the jitted step instead.
  other = {k: ((2 * s[0],) + s[1:], d) for k, (s, d) in shapes.items()}
  trainer, state = _run_job_steps(config, tmp_path / "other", batches, ahead=other)
  assert trainer.train_step._cache_size() == 1
  for k, v in tu.flat(ref.params).items():
    np.testing.assert_array_equal(tu.flat(state.params)[k], v, err_msg=k)


class _NoUserCache:
  """JAX's persistent cache unset (the tests set one), every program kept; restored after.
  `hits`: the cache hits meanwhile."""

  def __enter__(self):
    from jax._src import compilation_cache as cache_lib  # pylint: disable=g-import-not-at-top
    from jax._src import monitoring  # pylint: disable=g-import-not-at-top
    self.reset, self.monitoring = cache_lib.reset_cache, monitoring
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    self.saved = {k: getattr(jax.config, k) for k in keys}
    self.hits = []
    self.listener = lambda event, **kw: (self.hits.append(event) if event.endswith("/cache_hits")
                                         else None)
    monitoring.register_event_listener(self.listener)
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # tiny programs too
    self.reset()
    return self

  def __exit__(self, *exc):
    self.monitoring.unregister_event_listener(self.listener)
    for k, v in self.saved.items():
      jax.config.update(k, v)
    self.reset()


@pytest.mark.slow
def test_job_keeps_its_compiled_programs_in_the_workdir(tmp_path):
  """main.run keeps the job's XLA programs in WORKDIR/xla_cache: the resumed run loads them
  instead of compiling."""
  from bert_jax import main  # pylint: disable=g-import-not-at-top
  with _NoUserCache() as cache:
    config = tu.tiny_config(num_train_steps=2, checkpoint_every_steps=0, eval_steps=0)
    main.run(config, str(tmp_path / "job"))
    assert any((tmp_path / "job" / "xla_cache").iterdir())
    cache.hits.clear()
    config.num_train_steps = 3  # the same job resumed: its train step is loaded
    main.run(config, str(tmp_path / "job"))
    assert cache.hits


@pytest.mark.slow  # two more tiny jobs (~10 s)
def test_job_compilation_cache_kept_where_the_user_set_it_or_off(tmp_path):
  from bert_jax import main  # pylint: disable=g-import-not-at-top
  with _NoUserCache() as cache:
    config = tu.tiny_config(num_train_steps=2, checkpoint_every_steps=0, eval_steps=0)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))
    cache.reset()
    main.run(config, str(tmp_path / "job"))
    assert not (tmp_path / "job" / "xla_cache").exists() and (tmp_path / "users").exists()
    jax.config.update("jax_compilation_cache_dir", None)
    config.compilation_cache_dir = "none"
    main.run(config, str(tmp_path / "off"))
    assert not (tmp_path / "off" / "xla_cache").exists()


def test_held_out_mlm_perplexity_in_log_tensorboard_and_metrics_json(tmp_path, caplog):
  """Issue 36 item 3: every pre-training evaluation reports exp(held-out masked-LM loss),
  the paper's "LM ppl" (Table 6), on the console, in TensorBoard and in WORKDIR/metrics.json
  (its history kept across reruns); held_out_perplexity reads the last one."""
  import logging  # pylint: disable=g-import-not-at-top
  import math  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(eval_steps=2, eval_every_steps=2, num_train_steps=4,
                          checkpoint_every_steps=2, max_steps_per_run=2)
  with caplog.at_level(logging.INFO):
    train.train_and_evaluate(config, str(tmp_path))
    train.train_and_evaluate(config, str(tmp_path))
  saved = json.loads((tmp_path / "metrics.json").read_text())["eval"]
  assert sorted(saved, key=int) == ["2", "4"]
  for step, scalars in saved.items():
    assert scalars["mlm_perplexity"] == pytest.approx(math.exp(scalars["mlm_loss"]))
    tb = tu.read_scalars(tmp_path, "eval/mlm_perplexity")
    assert tb[int(step)] == pytest.approx(scalars["mlm_perplexity"], rel=1e-6)
  assert any("eval at step 4" in r.getMessage() and
             f"mlm_ppl {saved['4']['mlm_perplexity']:.4f}" in r.getMessage() for r in caplog.records)
  assert metrics_lib.held_out_perplexity(str(tmp_path)) == (4, saved["4"]["mlm_perplexity"])
  assert metrics_lib.held_out_perplexity(str(tmp_path / "nothing")) is None


def test_eval_at_start_evaluates_the_first_weights_once(tmp_path, caplog):
  """config.eval_at_start: the held-out evaluation of the weights a run starts from (step 0,
  a continued pre-training's baseline) before its first step; not again when a rerun resumes."""
  import logging  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(eval_steps=1, eval_every_steps=0, num_train_steps=2,
                          checkpoint_every_steps=1, max_steps_per_run=1, eval_at_start=True)
  with caplog.at_level(logging.INFO):
    train.train_and_evaluate(config, str(tmp_path))
    train.train_and_evaluate(config, str(tmp_path))
  saved = json.loads((tmp_path / "metrics.json").read_text())["eval"]
  assert sorted(saved, key=int) == ["0", "2"] and saved["0"] != saved["2"]
  assert sum("eval at step 0 " in r.getMessage() for r in caplog.records) == 1
  assert tu.read_scalars(tmp_path, "eval/mlm_loss")[0] == pytest.approx(saved["0"]["mlm_loss"])
