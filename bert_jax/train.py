"""BERT pre-training: the job that `main.py` runs for `config.task == "pretrain"`.

It picks the model and objective that config.objective names (bert_jax/registry.py: masked
LM + optional NSP, ...), the data (the prepared corpus or synthetic batches) and the
held-out evaluation; `bert_jax/trainer.py` does the rest (sharded state, jitted steps,
checkpoints, the loop). `train_and_evaluate(config, workdir)` is the job; main.py picks it,
finetune.finetune or the suite by config.task.
"""
from __future__ import annotations

import os
from typing import Any

from absl import logging
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import convert
from bert_jax import metrics as metrics_lib
from bert_jax import registry
from bert_jax import trainer as trainer_lib
from bert_jax.model import BertConfig
from bert_jax.trainer import TrainState
from input_pipeline import build as data_build
from input_pipeline import data_config
from input_pipeline import errors
from input_pipeline import fileio
from input_pipeline import pretrain as pretrain_data

# BertConfig fields an imported checkpoint must agree with (the rest, e.g. dropout, may differ).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                       "hidden_act", "layer_norm_eps")


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
    raise convert.CheckpointMismatchError(f"init_checkpoint {path} does not fit the configured model "
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
  if convert.is_orbax_checkpoint(path):
    got = {tuple(k): v for k, v in convert.saved_param_shapes(path).items()}
    fresh, extra = _check_fits(path, cfg, want_shapes, got)
    subset = flax.traverse_util.unflatten_dict({k: a for k, a in want.items() if k in got})
    convert.check_step_intact(path)
    step, params = convert.restore_params(path, subset)
    loaded = _flat_keys(params)
    finite = jax.jit(lambda t: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x))
                                                  for x in jax.tree.leaves(t)])))(params)
    if not bool(finite):
      raise convert.CorruptCheckpointFileError(
          f"init_checkpoint {path} (step {step}) holds NaN or infinite parameters: use an "
          "intact copy of the run or another checkpoint.")
    logging.info("Initialised params from %s (step %d).", path, step)
  else:
    # The one host-side loader (exports, HuggingFace, Google TF); our own runs are restored
    # above, shard by shard onto the mesh, without a copy of the model on one host.
    ckpt_cfg, params, _ = convert.load_params(path, "pretraining", require_mlm=False)
    params = convert.to_layout(params, cfg.num_layers, cfg.scan_layers)
    differ = [f"{f}: checkpoint {getattr(ckpt_cfg, f)!r} vs config {getattr(cfg, f)!r}"
              for f in ARCHITECTURE_FIELDS if getattr(ckpt_cfg, f) != getattr(cfg, f)]
    if differ:
      raise convert.CheckpointMismatchError(
          f"init_checkpoint {path} was trained with another architecture; set config.model to "
          "match it:\n  " + "\n  ".join(differ))
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


def check_config(config: ml_collections.ConfigDict) -> None:
  """Pre-training values that cannot work, named before any work (ConfigError)."""
  trainer_lib.check_config(config)
  if config.num_train_steps < 1:
    raise errors.ConfigError(f"--config.num_train_steps={config.num_train_steps}: it must be at "
                             "least 1 (the step the run ends at).")
  for k in ("eval_steps", "eval_every_steps"):
    if config[k] < 0:
      raise errors.ConfigError(f"--config.{k}={config[k]}: 0 = off, or a positive number.")
  data_config.check(config.data)
  # The model's fields (sizes, activation, ...) and the objective before the vocabulary and
  # data are built; the vocabulary's size is only known then.
  model, _, _ = registry.pretraining(config, config.model.get("vocab_size") or 1)
  cfg = model.config
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise errors.ConfigError(
        f"--config.data.max_seq_length={config.data.max_seq_length} exceeds the model's position "
        f"table (config.model.max_position_embeddings={cfg.max_position_embeddings}): lower "
        "the one or raise the other.")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainState:
  """Pre-trains in `workdir` to config.num_train_steps (resuming from its checkpoints),
  evaluating on held-out data. main.run dispatches by config.task to this, the fine-tuning
  job or the suite, holding the workdir's lock."""
  if config.task != "pretrain":
    raise ValueError(f"config.task={config.task!r} is a fine-tuning task: run it with "
                     "bert_jax.main (or finetune.finetune).")
  workdir = os.fspath(workdir)
  check_config(config)
  fileio.path(workdir).mkdir(parents=True, exist_ok=True)
  data_cfg, vocab_size = data_build.prepare(config, workdir)
  model, objective, sample = registry.pretraining(config, vocab_size, data_cfg)
  cfg = model.config
  do_eval = config.eval_steps > 0
  trainer = trainer_lib.build(config, model, objective, sample, workdir,
                              eval_batch_size=config.eval_batch_size if do_eval else None)
  logging.info("Model %s (%s): %s; %d devices, mesh %s.", config.model.preset,
               config.get("objective", "mlm"), cfg, jax.device_count(), dict(trainer.mesh.shape))
  init_params = None
  if config.init_checkpoint:
    init_params = lambda state: load_init_params(config.init_checkpoint, cfg,
                                                 trainer.abstract.params, state.params)
  state, data_state = trainer.restore_or_init(init_params)
  if data_state is not None and (trainer.restored_config.get("data")
                                 != trainer_lib.json_config(config).get("data")):
    logging.info("The data config changed since step %d (e.g. phase 2): the input "
                 "iterator starts afresh.", int(jax.device_get(state.step)))
    data_state = None
  logging.info("%s parameters.", f"{trainer.num_params():,}")

  n = jax.process_count()
  hosts = dict(process_index=jax.process_index(), process_count=n)
  train_iter = pretrain_data.make_iterator(config, data_cfg, split="train",
                                           batch_size=config.global_batch_size // n,
                                           vocab_size=cfg.vocab_size, seed=config.seed, **hosts)
  if data_state is not None:
    train_iter.set_state(data_state)
  eval_iter, eval_batches = None, []
  if do_eval:
    eval_iter = pretrain_data.make_iterator(config, data_cfg, split="eval",
                                            batch_size=config.eval_batch_size // n,
                                            vocab_size=cfg.vocab_size, seed=config.seed, **hosts)

  def evaluate(step, state):
    if not eval_batches:  # the same held-out batches every time, read once
      eval_batches.extend(next(eval_iter) for _ in range(config.eval_steps))
    sums = trainer_lib.evaluate_sums(trainer, state.params, eval_batches)
    return metrics_lib.report_eval(trainer.writer, step, sums, trainer.objective)

  eval_at = lambda step: bool((config.eval_every_steps and step % config.eval_every_steps == 0)
                              or step == config.num_train_steps)
  result = trainer_lib.run(trainer, state, train_iter, num_steps=config.num_train_steps,
                           evaluate=evaluate if do_eval else None, eval_at=eval_at)
  logging.info("Outputs in %s: checkpoints (latest: step %d) in %s; TensorBoard: "
               "tensorboard --logdir=%s", workdir, result.step, trainer.checkpointer.directory,
               workdir)
  return result.state
