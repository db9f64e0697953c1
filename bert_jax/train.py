"""BERT pre-training: the job that `main.py` runs for `config.task == "pretrain"`.

It picks the model and objective that config.objective names (bert_jax/registry.py: masked
LM + optional NSP, ...), the data (the prepared corpus or synthetic batches) and the
held-out evaluation; `bert_jax/trainer.py` does the rest (sharded state, jitted steps,
checkpoints, the loop). `train_and_evaluate(config, workdir)` is the job; main.py picks it,
finetune.finetune or the suite by config.task.
"""
from __future__ import annotations

import os

from absl import logging
import jax
import ml_collections

from bert_jax import checkpointing
from bert_jax import metrics as metrics_lib
from bert_jax import registry
from bert_jax import trainer as trainer_lib
from bert_jax import vocab_transfer
from bert_jax.trainer import TrainState
from common import errors
from common import fileio
from input_pipeline import build as data_build
from input_pipeline import data_config
from input_pipeline import pretrain as pretrain_data
from input_pipeline import vocab as vocab_lib

def check_config(config: ml_collections.ConfigDict) -> None:
  """Pre-training values that cannot work, named before any work (ConfigError)."""
  trainer_lib.check_config(config)
  if config.num_train_steps < 1:
    raise errors.ConfigError(f"--config.num_train_steps={config.num_train_steps}: it must be at "
                             "least 1 (the step the run ends at).")
  for k in ("eval_steps", "eval_every_steps"):
    if config[k] < 0:
      raise errors.ConfigError(f"--config.{k}={config[k]}: 0 = off, or a positive number.")
  if config.get("eval_at_start") and not config.eval_steps:
    raise errors.ConfigError("--config.eval_at_start=True needs held-out batches: set "
                             "--config.eval_steps to a positive number (0 = no evaluation).")
  data_config.check(config.data)
  mode = config.get("vocab_transfer", "none")
  if mode not in vocab_transfer.MODES:
    raise errors.ConfigError(f"--config.vocab_transfer={mode!r}: choose one of "
                             f"{', '.join(vocab_transfer.MODES)}.")
  kind = config.build.get("vocab_kind", "")
  if kind not in ("",) + vocab_lib.KINDS:
    raise errors.ConfigError(
        f"--config.build.vocab_kind={kind!r}: choose one of {', '.join(vocab_lib.KINDS)}, or "
        f"'' for the model family's ({registry.family(config).vocab_kind}).")
  # The model's fields (sizes, activation, ...) and the objective before the vocabulary and
  # data are built (no model built); the vocabulary's size is only known then.
  cfg = registry.pretraining_config(config, config.model.get("vocab_size") or 1)
  if config.data.max_seq_length > cfg.max_length:
    raise errors.ConfigError(
        f"--config.data.max_seq_length={config.data.max_seq_length} exceeds the model's position "
        f"table (config.model.max_position_embeddings={cfg.max_position_embeddings}): lower "
        "the one or raise the other.")


def _data_changes(saved: dict, now: dict) -> list[str]:
  """How the data config differs from the one a checkpoint saved (checkpointing's config
  diff); a field the saved one lacks (a field added since) counts as its default."""
  defaults = data_config.default_data_config().to_dict()
  filled = {**{k: defaults[k] for k in now if k in defaults}, **saved}
  return checkpointing.config_changes({"data": filled}, {"data": now})


def _train_iterator(config, data_cfg, trainer: trainer_lib.Trainer, state: TrainState,
                    data_state, vocab_size: int):
  """This host's rows of each training batch, from where the checkpoint left the data (or
  afresh: a new run or a changed data config); a mixture's shares in the progress lines."""
  n = jax.process_count()
  train_iter = pretrain_data.make_iterator(config, data_cfg, split="train",
                                           batch_size=config.global_batch_size // n,
                                           vocab_size=vocab_size, seed=config.seed,
                                           process_index=jax.process_index(), process_count=n)
  if data_state is not None:
    train_iter.set_state(data_state)
  elif data_cfg.get("mixture") and int(jax.device_get(state.step)):
    # A fresh mixture mid-run (e.g. a new phase): its temperature schedule counts steps.
    train_iter.set_state({"batches": int(jax.device_get(state.step))})
  if data_cfg.get("mixture"):
    trainer.metrics.host_scalars = lambda: {f"data_share/{name}": share
                                            for name, share in train_iter.shares().items()}
  return train_iter


def _start(config, trainer: trainer_lib.Trainer, data_cfg, cfg, workdir: str
           ) -> tuple[TrainState, object]:
  """(state, data state): the workdir's newest checkpoint, else a fresh state with
  init_checkpoint's weights in place (its vocabulary transferred to the data's where
  config.vocab_transfer says so); the data state is dropped when the data config changed."""
  init = config.init_checkpoint or None
  if init and trainer.checkpointer.latest_step() is None:  # a run's first start
    init = vocab_transfer.checkpoint_source(init, config.get("vocab_transfer", "none"),
                                            data_build.vocab_of(config, data_cfg), cfg,
                                            workdir)
  state, data_state = trainer.restore_or_init(init, model_config=cfg,
                                              name=config.init_checkpoint or None)
  changes = [] if data_state is None else _data_changes(
      trainer.restored_config.get("data") or {}, trainer_lib.json_config(config).get("data") or {})
  if changes:
    logging.info("The data config changed since step %d (e.g. phase 2: %s): the input "
                 "iterator starts afresh.", int(jax.device_get(state.step)), "; ".join(changes[:3]))
    data_state = None
  return state, data_state


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
  data_cfg, vocab_size = data_build.build_data(config, workdir,
                                               vocab_kind=registry.family(config).vocab_kind)
  model, objective, sample = registry.pretraining(config, vocab_size, data_cfg)
  cfg = model.config
  for field, value in registry.gpu_defaults(config, data_cfg).items():
    logging.info("On GPU at max_seq_length %d the job sets model.%s=%r (measured faster; "
                 "set --config.model.%s to choose otherwise).", data_cfg.max_seq_length, field,
                 value, field)
  do_eval = config.eval_steps > 0
  trainer = trainer_lib.build(config, model, objective, sample, workdir,
                              eval_batch_size=config.eval_batch_size if do_eval else None)
  logging.info("Model %s (%s): %s; %d devices, mesh %s.", config.model.preset,
               config.get("objective", "mlm"), cfg, jax.device_count(), dict(trainer.mesh.shape))
  if (trainer.checkpointer.latest_step() or 0) < config.num_train_steps:  # steps to run
    trainer.compile_ahead(pretrain_data.batch_shapes(data_cfg, config.global_batch_size))
  state, data_state = _start(config, trainer, data_cfg, cfg, workdir)
  logging.info("%s parameters.", f"{trainer.num_params():,}")
  train_iter = _train_iterator(config, data_cfg, trainer, state, data_state, cfg.vocab_size)
  eval_iter, eval_batches = None, []
  if do_eval:
    n = jax.process_count()
    eval_iter = pretrain_data.make_iterator(config, data_cfg, split="eval",
                                            batch_size=config.eval_batch_size // n,
                                            vocab_size=cfg.vocab_size, seed=config.seed,
                                            process_index=jax.process_index(), process_count=n)

  def evaluate(step, state):
    if not eval_batches:  # the same held-out batches every time, read once
      eval_batches.extend(next(eval_iter) for _ in range(config.eval_steps))
    sums = trainer_lib.evaluate_sums(trainer, state.params, eval_batches)
    scalars = metrics_lib.report_eval(trainer.writer, step, sums, trainer.objective)
    if jax.process_index() == 0:
      metrics_lib.record_eval(workdir, step, scalars)
    return scalars

  eval_at = lambda step: bool((config.eval_every_steps and step % config.eval_every_steps == 0)
                              or step == config.num_train_steps)
  if do_eval and config.get("eval_at_start") and int(jax.device_get(state.step)) == 0:
    evaluate(0, state)
  result = trainer_lib.run(trainer, state, train_iter, num_steps=config.num_train_steps,
                           evaluate=evaluate if do_eval else None, eval_at=eval_at)
  logging.info("Outputs in %s: checkpoints (latest: step %d) in %s; TensorBoard: "
               "tensorboard --logdir=%s", workdir, result.step, trainer.checkpointer.directory,
               workdir)
  return result.state
