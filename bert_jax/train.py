"""BERT pre-training: train state, the jitted train/eval steps, and the training loop.

`train_and_evaluate(config, workdir)` is the whole job (what `main.py` calls):
shapes first (`jax.eval_shape` of the init), shardings from the parameters'
logical axis names, a jitted init that creates the state already sharded (or a
restore of the latest checkpoint in `workdir`), then one jitted
`train_step(state, batch, rng)` with the state donated.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from typing import Any

from absl import logging
import flax
import flax.linen as nn
from flax import struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import checkpointing
from bert_jax import data as data_lib
from bert_jax import fileio
from bert_jax import flops as flops_lib
from bert_jax import metrics as metrics_lib
from bert_jax import optim
from bert_jax import sharding
from bert_jax.model import BertConfig, BertForPreTraining, pretraining_loss

MODEL_INPUTS = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")
# Packed rows (data.packing) also pass these, by keyword (see bert_jax.model.BertModel).
PACKED_INPUTS = ("position_ids", "packed_example_ids", "cls_positions")
# BertConfig fields an imported checkpoint must agree with (the rest, e.g. dropout, may differ).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                       "hidden_act", "layer_norm_eps")


class TrainState(struct.PyTreeNode):
  """Everything a checkpoint must hold to continue bit-identically (plus the data position)."""
  step: jax.Array  # int32 scalar: updates applied so far
  params: Any  # float32 master weights
  opt_state: Any  # float32 optimizer moments (+ counters)


def bert_config(config: ml_collections.ConfigDict, vocab_size: int | None = None) -> BertConfig:
  """config.model (a preset + overrides; None = the preset's value) -> BertConfig."""
  overrides = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
  if "hidden_size" in overrides and "intermediate_size" not in overrides:
    overrides["intermediate_size"] = 4 * overrides["hidden_size"]
  if "vocab_size" not in overrides:
    if vocab_size is None:
      raise ValueError("config.model.vocab_size is unset and there is no vocabulary to take "
                       "it from; set --config.model.vocab_size.")
    overrides["vocab_size"] = vocab_size
  elif vocab_size is not None and overrides["vocab_size"] < vocab_size:
    raise ValueError(f"config.model.vocab_size={overrides['vocab_size']} is smaller than the "
                     f"vocabulary ({vocab_size} entries).")
  return BertConfig.from_preset(config.model.preset, **overrides)


def init_state(rng: jax.Array, *, model: BertForPreTraining, tx: optax.GradientTransformation,
               seq_len: int, num_predictions: int) -> TrainState:
  """A fresh TrainState with *boxed* (logically named) params and optimizer state."""
  ids = jnp.ones((1, seq_len), jnp.int32)
  positions = jnp.zeros((1, num_predictions), jnp.int32)
  params = model.init({"params": rng}, ids, jnp.zeros_like(ids), ids, positions)["params"]
  # tx.init maps over the boxed params, so moments inherit their logical axes.
  return TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=tx.init(params))


def _microbatches(batch: dict[str, jax.Array], n: int) -> dict[str, jax.Array]:
  """[B, ...] -> [n, B/n, ...]; micro-batch i holds rows i, n+i, 2n+i, ... so that each
  device's rows split locally (no data movement under batch sharding)."""
  def split(x):
    x = jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1)
    return nn.with_logical_constraint(x, (None, "activation_batch") + (None,) * (x.ndim - 2))
  return jax.tree.map(split, batch)


@struct.dataclass
class Objective:
  """What a train step optimises: the model inputs, per-batch metric sums, the
  denominators taken over the *global* batch, and how they make the loss.

  Pre-training is one objective (PRETRAINING); each fine-tuning task is another
  (bert_jax/finetune.py), all run by the same `train_step`.
  """
  inputs: tuple[str, ...] = struct.field(pytree_node=False)
  sums: Any = struct.field(pytree_node=False)  # (outputs, batch) -> dict of sums
  denominators: Any = struct.field(pytree_node=False)  # global batch -> dict of scalars
  loss: Any = struct.field(pytree_node=False)  # (sums, denominators) -> scalar loss
  # Batch keys passed to the model by keyword (e.g. PACKED_INPUTS for packed rows).
  keyword_inputs: tuple[str, ...] = struct.field(pytree_node=False, default=())

  def apply(self, model, params, batch, **kwargs):
    """model.apply on the objective's inputs of `batch`."""
    return model.apply({"params": params}, *(batch[k] for k in self.inputs),
                       **{k: batch[k] for k in self.keyword_inputs}, **kwargs)


def _pretraining_denominators(batch):
  mlm = jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1e-8)
  if "example_weights" in batch:
    nsp = jnp.maximum(jnp.sum(batch["example_weights"].astype(jnp.float32)), 1e-8)
  else:
    nsp = jnp.float32(batch["next_sentence_labels"].shape[0])
  return {"mlm": mlm, "nsp": nsp}


def _pretraining_sums(outputs, batch):
  # Real (non-padding) tokens: throughput that packing is measured by.
  num_tokens = jnp.sum(batch["input_mask"].astype(jnp.float32))
  return dict(pretraining_loss(outputs, batch)[1], num_tokens=num_tokens)


def _pretraining_loss(sums, denominators):
  loss = sums["mlm_loss_sum"] / denominators["mlm"]
  if "nsp_loss_sum" in sums:  # a model with the NSP head (BertForPreTraining(nsp=True))
    loss = loss + sums["nsp_loss_sum"] / denominators["nsp"]
  return loss


# MLM + NSP, or MLM alone for BertForPreTraining(nsp=False): the sums say which.
PRETRAINING = Objective(
    inputs=MODEL_INPUTS, sums=_pretraining_sums,
    denominators=_pretraining_denominators, loss=_pretraining_loss)
# Packed rows (data.packing): the same loss over the examples of every row.
PRETRAINING_PACKED = PRETRAINING.replace(keyword_inputs=PACKED_INPUTS)


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *,
               model: BertForPreTraining, tx: optax.GradientTransformation,
               micro_steps: int = 1, objective: Objective = PRETRAINING
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on the global batch, accumulated over `micro_steps` micro-batches.

  Losses are normalised by the *global* batch's denominators (MLM weight and
  example count for pre-training), so the summed micro-batch gradients equal the
  gradient of the full batch.
  """
  rng = jax.random.fold_in(rng, state.step)
  denominators = objective.denominators(batch)

  def loss_fn(params, micro, micro_rng):
    outputs = objective.apply(model, params, micro, deterministic=False,
                              rngs={"dropout": micro_rng})
    sums = objective.sums(outputs, micro)
    return objective.loss(sums, denominators), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_steps == 1:
    (loss, sums), grads = grad_fn(state.params, batch, jax.random.fold_in(rng, 0))
  else:
    def accumulate(carry, xs):
      micro, i = xs
      (l, s), g = grad_fn(state.params, micro, jax.random.fold_in(rng, i))
      return jax.tree.map(jnp.add, carry, (l, s, g)), None
    micro = _microbatches(batch, micro_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                         jax.eval_shape(grad_fn, state.params, first, rng))
    (loss, sums, grads), _ = jax.lax.scan(
        accumulate, (zeros[0][0], zeros[0][1], zeros[1]), (micro, jnp.arange(micro_steps)))

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums, loss=loss, grad_norm=optax.global_norm(grads),
                 param_norm=optax.global_norm(params))
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: BertForPreTraining,
              objective: Objective = PRETRAINING) -> dict[str, jax.Array]:
  return objective.sums(objective.apply(model, params, batch, deterministic=True), batch)


def pretraining_objective(data_cfg) -> Objective:
  """PRETRAINING, or PRETRAINING_PACKED for data.packing rows."""
  return PRETRAINING_PACKED if data_cfg.get("packing", False) else PRETRAINING


def create_train_state(config: ml_collections.ConfigDict, model: BertForPreTraining,
                       tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                       rules) -> tuple[Any, Any, functools.partial]:
  """Shapes and shardings of the state, and a jitted init that yields it sharded.

  Returns (abstract_state, state_shardings, init_fn): abstract_state holds
  ShapeDtypeStructs carrying their shardings (a restore target for Orbax).
  """
  init = functools.partial(init_state, model=model, tx=tx, seq_len=config.data.max_seq_length,
                           num_predictions=config.data.max_predictions_per_seq)
  rng = jax.random.key(config.seed)
  boxed = jax.eval_shape(init, rng)
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          sharding.strip_boxes(boxed), shardings)
  jit_init = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)
  return abstract, shardings, functools.partial(jit_init, rng)


def _flat_keys(tree: Any) -> dict[tuple[str, ...], Any]:
  return {tuple(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _part(keys: tuple[str, ...]) -> str:
  """Which part of BertForPreTraining a parameter belongs to."""
  if keys[0] == "bert":
    return "pooler" if keys[1] == "pooler" else "encoder"
  if keys[0] in ("transform", "transform_LayerNorm", "output_bias"):
    return "masked-LM head"
  return "NSP head" if keys[0] == "seq_relationship" else "other"


def _check_fits(path: str, cfg: BertConfig, want: dict[tuple, tuple[int, ...]],
                got: dict[tuple, tuple[int, ...]]) -> tuple[list[str], list[str]]:
  """Fails unless the checkpoint's encoder fits the model; returns (parts the model has and
  the checkpoint lacks, which start fresh; parts the checkpoint has and the model does not use)."""
  missing = sorted(set(want) - set(got))
  unused = sorted(set(got) - set(want))
  problems = [f"missing {'/'.join(k)}" for k in missing if _part(k) == "encoder"]
  problems += [f"unexpected {'/'.join(k)}" for k in unused if _part(k) == "encoder"]
  problems += [f"{'/'.join(k)}: checkpoint {tuple(got[k])} vs model {tuple(want[k])}"
               for k in sorted(set(got) & set(want)) if tuple(got[k]) != tuple(want[k])]
  if problems:
    raise ValueError(f"init_checkpoint {path} does not fit the configured model "
                     f"({cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab "
                     f"{cfg.vocab_size}, {cfg.max_position_embeddings} positions):\n  "
                     + "\n  ".join(problems[:20]))
  fresh = sorted({_part(k) for k in missing})
  extra = sorted({_part(k) for k in unused})
  return fresh, extra


def load_init_params(path: str, cfg: BertConfig, abstract_params: Any, fresh_params: Any) -> Any:
  """Params from `config.init_checkpoint`: a run of ours (Orbax) or a converted
  HuggingFace / Google / exported checkpoint (BertForPreTraining, BertForMaskedLM or
  BertModel), placed with the target shardings. Parts of the model the checkpoint lacks
  (the NSP head and pooler of an MLM-only checkpoint, the masked-LM head of an encoder-only
  one) keep their `fresh_params`; parts the model does not use (e.g. the NSP head when
  data.nsp is off) are left out. Both are logged."""
  want = _flat_keys(abstract_params)
  want_shapes = {k: tuple(a.shape) for k, a in want.items()}
  if checkpointing.is_orbax_checkpoint(path):
    got = {tuple(k): v for k, v in checkpointing.saved_param_shapes(path).items()}
    fresh, extra = _check_fits(path, cfg, want_shapes, got)
    subset = flax.traverse_util.unflatten_dict({k: a for k, a in want.items() if k in got})
    step, params = checkpointing.restore_params(path, subset)
    loaded = _flat_keys(params)
    logging.info("Initialised params from %s (step %d).", path, step)
  else:
    from bert_jax import convert  # pylint: disable=g-import-not-at-top
    ckpt_cfg, params = convert.load_pretrained(path, target="pretraining", require_mlm=False,
                                               scan_layers=cfg.scan_layers)
    differ = [f"{f}: checkpoint {getattr(ckpt_cfg, f)!r} vs config {getattr(cfg, f)!r}"
              for f in ARCHITECTURE_FIELDS if getattr(ckpt_cfg, f) != getattr(cfg, f)]
    if differ:
      raise ValueError(f"init_checkpoint {path} was trained with another architecture; set "
                       "config.model to match it:\n  " + "\n  ".join(differ))
    host = _flat_keys(params)
    fresh, extra = _check_fits(path, cfg, want_shapes, {k: np.shape(x) for k, x in host.items()})
    loaded = {k: jax.make_array_from_callback(
        a.shape, a.sharding, lambda idx, x=host[k], a=a: np.asarray(x, a.dtype)[idx])
              for k, a in want.items() if k in host}
    logging.info("Initialised params from converted checkpoint %s (%s).", path,
                 convert.describe_heads(convert.heads(params)))
  if fresh:
    logging.warning("init_checkpoint %s has no %s: %s from a fresh initialisation.", path,
                    " and no ".join(fresh), "they start" if len(fresh) > 1 else "it starts")
  if extra:
    logging.warning("init_checkpoint %s holds parts that this model does not use, left out: "
                    "%s (a model with data.nsp=False has no NSP head and no pooler).", path,
                    ", ".join(extra))
  fresh_flat = _flat_keys(fresh_params)
  return flax.traverse_util.unflatten_dict({k: loaded.get(k, fresh_flat[k]) for k in want})


class _Preemption:
  """SIGTERM -> save a checkpoint at the next step and exit cleanly. With several
  processes, Orbax's preemption sync point makes all of them stop at one step."""

  def __init__(self, checkpointer: checkpointing.Checkpointer):
    self.checkpointer = checkpointer
    self.requested = False
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del frame
    logging.warning("Received signal %d: checkpointing and stopping.", signum)
    self.requested = True

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      self.requested = bool(self.checkpointer.manager.reached_preemption(step))
    return self.requested

  def restore(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def evaluate(p_eval_step, params, batches, batch_sharding) -> dict[str, float]:
  """Metric sums over held-out host-local `batches`."""
  sums = None
  for batch in batches:
    m = p_eval_step(params, sharding.host_to_global(batch, batch_sharding))
    sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
  return {k: float(v) for k, v in jax.device_get(sums).items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainState:
  """Runs the job `config.task` in `workdir` (resuming from its checkpoints)."""
  if config.task == "pretrain":
    return pretrain(config, workdir)
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top  (finetune imports us)
  return finetune.finetune(config, workdir)


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> TrainState:
  """Pre-trains (MLM + NSP) to config.num_train_steps; evaluates on held-out data."""
  workdir = os.fspath(workdir)
  fileio.path(workdir).mkdir(parents=True, exist_ok=True)
  data_cfg, vocab_size = data_lib.prepare(config, workdir)
  cfg = bert_config(config, vocab_size)
  model = BertForPreTraining(cfg, nsp=data_cfg.nsp)
  tx = optim.make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  rules = tuple((name, tuple(ax) if isinstance(ax, list) else ax)
                for name, ax in config.logical_axis_rules)
  micro = config.grad_accum_steps
  sharding.check_batch_size(config.global_batch_size, micro, mesh, rules)
  if config.eval_steps > 0:
    sharding.check_batch_size(config.eval_batch_size, 1, mesh, rules)
  logging.info("Model %s: %s; %d devices, mesh %s.", config.model.preset, cfg,
               jax.device_count(), dict(mesh.shape))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return _pretrain(config, workdir, data_cfg, cfg, model, tx, mesh, rules, micro)


def _pretrain(config, workdir, data_cfg, cfg, model, tx, mesh, rules, micro) -> TrainState:
  abstract, state_sh, init_fn = create_train_state(config, model, tx, mesh, rules)
  ckpt = checkpointing.Checkpointer(workdir, keep=config.keep_checkpoints,
                                    keep_period=config.keep_checkpoint_period,
                                    async_save=config.async_checkpointing)
  restored = ckpt.restore(abstract, config)
  data_state = None
  if restored is not None:
    step, state, data_state, saved_cfg = restored
    logging.info("Resumed from %s/%d.", ckpt.directory, step)
    if saved_cfg.get("data") != json.loads(config.to_json_best_effort())["data"]:
      logging.info("The data config changed since step %d (e.g. phase 2): the input "
                   "iterator starts afresh.", step)
      data_state = None
  elif config.init_checkpoint:
    state = init_fn()
    state = state.replace(params=load_init_params(config.init_checkpoint, cfg, abstract.params,
                                                  state.params))
  else:
    state = init_fn()
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
  logging.info("%s parameters.", f"{n_params:,}")

  per_host = config.global_batch_size // jax.process_count()
  train_iter = data_lib.make_iterator(config, data_cfg, split="train", batch_size=per_host,
                                      vocab_size=cfg.vocab_size, seed=config.seed)
  if data_state is not None:
    train_iter.set_state(data_state)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)
  objective = pretraining_objective(data_cfg)
  p_train_step = jax.jit(
      functools.partial(train_step, model=model, tx=tx, micro_steps=micro, objective=objective),
      in_shardings=(state_sh, batch_sh, repl), out_shardings=(state_sh, repl),
      donate_argnums=(0,))
  p_eval_step = jax.jit(functools.partial(eval_step, model=model, objective=objective),
                        in_shardings=(state_sh.params, batch_sh), out_shardings=repl)
  eval_iter, eval_batches = None, []
  if config.eval_steps > 0:
    eval_iter = data_lib.make_iterator(
        config, data_cfg, split="eval", batch_size=config.eval_batch_size // jax.process_count(),
        vocab_size=cfg.vocab_size, seed=config.seed)

  from input_pipeline import pretrain as pretrain_data  # pylint: disable=g-import-not-at-top
  seq_len, preds = data_cfg.max_seq_length, pretrain_data.predictions_per_row(data_cfg)
  writer = metrics_lib.make_writer(workdir)
  train_metrics = metrics_lib.TrainMetrics(
      writer, total_steps=config.num_train_steps,
      tokens_per_step=config.global_batch_size * seq_len,
      flops_per_step=flops_lib.train_flops_per_step(cfg, config.global_batch_size, seq_len, preds,
                                                    nsp=model.nsp),
      peak_flops=flops_lib.peak_flops(str(cfg.dtype), config.peak_flops_per_device),
      learning_rate=functools.partial(optim.host_learning_rate, config))
  dropout_rng = jax.random.fold_in(jax.random.key(config.seed), 1)
  preempted = _Preemption(ckpt)

  def run_eval(step):
    if not eval_batches:  # the same held-out batches every time, read once
      eval_batches.extend(next(eval_iter) for _ in range(config.eval_steps))
    sums = evaluate(p_eval_step, state.params, eval_batches, batch_sh)
    return metrics_lib.report_eval(writer, step, sums)

  start = int(jax.device_get(state.step))
  end = config.num_train_steps
  if config.max_steps_per_run > 0:
    end = min(end, start + config.max_steps_per_run)
  if start >= config.num_train_steps:
    logging.info("Training already reached step %d (num_train_steps=%d).", start, end)
  log_step = None
  step = start
  try:
    for step in range(start + 1, end + 1):  # `step` counts updates done after this one
      t0 = time.perf_counter()
      with jax.profiler.StepTraceAnnotation("train", step_num=step):
        batch = sharding.host_to_global(next(train_iter), batch_sh)
        state, m = p_train_step(state, batch, dropout_rng)
      train_metrics.add(step, m)
      if step == start + 1:
        jax.block_until_ready(m)
        logging.info("First step (compilation included) took %.1fs.", time.perf_counter() - t0)
        train_metrics.start_timer(step)
      if log_step is not None:  # read the previous log step now that this one is queued
        train_metrics.report(log_step)
        log_step = None
      stop = preempted(step) or step == end
      do_eval = eval_iter is not None and (
          (config.eval_every_steps and step % config.eval_every_steps == 0)
          or step == config.num_train_steps)
      do_save = step % config.checkpoint_every_steps == 0 or stop
      if step % config.log_every_steps == 0 or stop:
        if do_eval or do_save:
          train_metrics.report(step)  # blocking here anyway
        else:
          log_step = step
      if do_save:
        train_metrics.check(step)  # never save a state whose loss went NaN
        ckpt.save(step, state, train_iter.get_state(), config)
      if do_eval:
        run_eval(step)
      if stop:
        break
  except metrics_lib.NonFiniteLossError:
    ckpt.wait()
    logging.error("Stopping: non-finite loss. Checkpoints kept in %s (latest: step %s).",
                  ckpt.directory, ckpt.latest_step())
    raise
  finally:
    preempted.restore()
    ckpt.close()
    writer.flush()
  if preempted.requested:
    logging.warning("Preempted: saved step %d; rerun the same command to continue.", step)
  return state
