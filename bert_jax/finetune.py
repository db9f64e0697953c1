"""Fine-tuning: GLUE / custom classification, SQuAD v1.1/v2.0, CoNLL NER, SWAG, and
contrastive fine-tuning into an embedding model (task embed, bert_jax/contrastive.py).

    python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
        --config.data_dir=glue/CoLA --config.vocab_path=vocab.txt --workdir=/tmp/cola

Each task (its record in bert_jax/tasks.py) picks its head, objective, features and dev
evaluation; `bert_jax/trainer.py` does the rest as for pre-training: sharded state,
gradient accumulation, remat, Orbax checkpoints (resume after a kill, SIGTERM save),
progress lines with tokens/s, MFU and ETA, TensorBoard curves. The batches come from input_pipeline/epochs.py (shuffled per
epoch, each host feeding its rows of the global batch). After every epoch it evaluates
on the dev set, keeps the best parameters (`workdir/best`), and writes predictions in
each task's submission format plus `metrics.json` (process 0 writes, every host reads).

Classification packs its training examples several to a row (input_pipeline/packing.py;
`config.packing` unset: each batch's examples into the rows it needs, where that saves rows,
see `packs`): attention is block-diagonal, positions restart per example and every example
is classified from its own [CLS], so the loss equals that of the same examples unpacked
while far fewer padding tokens are computed. With packed_batch "rows" steps and resume
offsets count rows; loss/accuracy still count examples. For embeddings (task=embed) each batch's texts
are packed instead (input_pipeline/epochs.PackedPairBatches): a batch still holds
global_batch_size pairs. Evaluation and prediction stay unpacked.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import best_dir, embed, families, finetuned, formats, heads, loader, objectives
from bert_jax import tasks
from bert_jax import trainer as trainer_lib
from common import errors, fileio
from input_pipeline import features
from input_pipeline.epochs import EpochIterator, PackedBatches, PackedExampleBatches, PackedPairBatches
from input_pipeline.tokenizer import Tokenizer

MIN_SEQ_LENGTH = 5  # [CLS] a [SEP] b [SEP] with a token of each segment


def _dev_outputs(trainer: trainer_lib.Trainer, params, feats, keys, batch_size: int):
  """(metric sums, model outputs) of every dev feature, on every host, through the trainer's
  evaluation loop. Each host feeds its rows of each global batch of `batch_size`; the last
  batch is padded with rows weighing 0 (outputs cut to the real rows)."""
  n = len(feats["input_ids"])
  b = batch_size // jax.process_count()
  lo = jax.process_index() * b
  starts = range(0, n, batch_size)

  def batches():
    for start in starts:
      rows = np.arange(start, start + batch_size)[lo:lo + b]
      batch = {k: feats[k][rows % n] for k in keys}
      real = (rows < n).astype(np.float32)
      batch["example_weights"] = batch.get("example_weights", 1) * real
      if "label_weights" in batch:
        batch["label_weights"] = batch["label_weights"] * real[:, None]
      yield batch
  outs = []
  sums = trainer_lib.evaluate_sums(trainer, params, batches(), outputs=outs)
  real_rows = []  # each batch's outputs cut to its real rows
  for start, out in zip(starts, outs):
    take = min(batch_size, n - start)
    real_rows.append(jax.tree.map(lambda x: np.asarray(x)[:take], out))  # pylint: disable=cell-var-from-loop
  return sums, jax.tree.map(lambda *xs: np.concatenate(xs), *real_rows)


def _check_features(config: ml_collections.ConfigDict) -> None:
  """The feature-based fields (bert_jax/configs/finetune.py, heads.FeatureBased), named in one
  line when they cannot work."""
  features = config.get("features", "last")
  if features not in heads.FEATURES:
    raise errors.ConfigError(f"--config.features={features!r}: choose one of "
                             f"{', '.join(heads.FEATURES)} (the paper's Table 7).")
  if config.get("bilstm_layers", 1) < 1 or config.get("bilstm_units", 0) < 0:
    raise errors.ConfigError(f"--config.bilstm_layers={config.get('bilstm_layers')}, "
                             f"--config.bilstm_units={config.get('bilstm_units')}: at least one "
                             "layer, and 0 units (no BiLSTM) or more.")
  if config.get("packing", False) and not heads.FeatureBased.of(config).plain:
    raise errors.ConfigError("--config.packing with --config.features / freeze_encoder / "
                             "bilstm_units: a feature-based head reads unpacked rows; set "
                             "--config.packing=False.")
  if config.get("cache_features", False) and not config.get("freeze_encoder", False):
    raise errors.ConfigError("--config.cache_features computes a frozen encoder's features "
                             "once per example: it needs --config.freeze_encoder=True.")
  if config.get("freeze_encoder", False) and not config.get("bilstm_units", 0) and (
      features in ("last", "second_to_last", "embeddings")):
    logging.warning("A frozen encoder with no BiLSTM and no learned layer weights trains the "
                    "classifier alone (a linear probe).")


def check_config(config: ml_collections.ConfigDict) -> bool | None:
  """Fails early on a config fine-tuning cannot run (unset fields, missing checkpoint or
  input files), naming the field to set; an unset config.vocab_path becomes the checkpoint's
  own vocabulary (logged). Returns config.packing (None: unset, the job decides: `packs`)."""
  if not config.init_checkpoint:
    raise errors.ConfigError("Fine-tuning needs --config.init_checkpoint (a pre-training workdir of ours, "
                      "a converted checkpoint, a HuggingFace directory or a Google TF checkpoint).")
  if config.task not in tasks.TASKS:
    raise errors.ConfigError(f"config.task={config.task!r}: choose one of "
                             f"{sorted(tasks.TASKS)}, 'pretrain' or 'suite'.")
  task = tasks.TASKS[config.task]
  trainer_lib.check_config(config)
  for field in ("global_batch_size", "eval_batch_size", "num_epochs", "max_seq_length"):
    if config[field] < 1:
      raise errors.ConfigError(f"config.{field}={config[field]}: it must be at least 1.")
  if config.max_seq_length < MIN_SEQ_LENGTH:
    raise errors.ConfigError(f"config.max_seq_length={config.max_seq_length}: at least "
                      f"{MIN_SEQ_LENGTH} tokens are needed for [CLS], [SEP] x2 and one token of "
                      "each segment (BERT: 128; 384 for SQuAD).")
  _check_features(config)
  packed = config.get("packing", False)
  if packed and not task.packing:
    packable = " or ".join(name for name, t in tasks.TASKS.items() if t.packing)
    raise errors.ConfigError(f"packing is only supported for classification fine-tuning and "
                             f"embeddings (task {packable}), not task={config.task!r}: set "
                             "--config.packing=False.")
  if packed is not False and config.get("packed_batch", "rows") not in ("rows", "examples"):
    raise errors.ConfigError(f"--config.packed_batch={config.packed_batch!r}: what a packed "
                             "batch of global_batch_size counts, 'rows' or 'examples'.")
  if packed is not False and config.get("max_examples_per_row", 0) < 1:
    raise errors.ConfigError(f"max_examples_per_row must be >= 1, got {config.get('max_examples_per_row')}.")
  if not loader.checkpoint_exists(config.init_checkpoint):
    raise errors.ConfigError(f"config.init_checkpoint: {config.init_checkpoint} does not exist: pass a "
                      "pre-training or fine-tuning workdir of ours, a converted checkpoint, a "
                      "HuggingFace model directory or a Google TF checkpoint (bert_model.ckpt).")
  if not config.vocab_path:
    config.vocab_path = _checkpoint_vocab(config.init_checkpoint)
  for field, what in task.fields.items():
    if not config[field]:
      value = "DIR" if field == "data_dir" else "PATH"
      raise errors.ConfigError(f"config.{field} is not set: pass --config.{field}={value} ({what}).")
  for field, path in task.files(config).items():
    if not fileio.path(path).exists():
      raise errors.ConfigError(f"config.{field}: {path} does not exist" + (
          f" (config.data_dir + config.{field})." if "data_dir" in config else "."))
  return packed


def _checkpoint_vocab(checkpoint: str) -> str:
  """config.vocab_path unset: the vocabulary `checkpoint` comes with (a HuggingFace or
  sentence-transformers directory's tokenizer, the one its run recorded), as predict and
  embed_eval take it; none is a ConfigError naming the field."""
  try:
    vocab = loader.checkpoint_vocab(embed.transformer_dir(checkpoint))
  except formats.CheckpointNotFoundError:
    raise errors.ConfigError(
        f"config.vocab_path is not set and {checkpoint} holds no vocabulary: pass "
        "--config.vocab_path=PATH (the vocabulary the checkpoint was trained with: vocab.txt, "
        "a SentencePiece .model, or the directory holding it, e.g. a HuggingFace model "
        "directory or a pre-training run's WORKDIR/vocab).") from None
  logging.info("Vocabulary: the checkpoint's own, %s (config.vocab_path is not set).", vocab)
  return vocab


def _dropout(enc_cfg: Any, model: ml_collections.ConfigDict) -> dict[str, float]:
  """The fine-tuning dropout rates config.model sets for the checkpoint's family."""
  family = families.of(enc_cfg)
  given = {k: v for k, v in model.items() if k.endswith("_dropout_rate") and v is not None}
  wrong = sorted(set(given) - set(family.dropout))
  if wrong:
    raise errors.ConfigError(
        f"config.model sets {', '.join(wrong)}, which the checkpoint's model "
        f"({family.name}) does not have; its dropout rates are "
        f"{', '.join(family.dropout)}.")
  return {**{k: v for k, v in family.dropout.items() if v is not None}, **given}


def _load(config: ml_collections.ConfigDict) -> tuple[Any, Any, Tokenizer]:
  """(model config, encoder params, tokenizer): the architecture is the checkpoint's;
  dropout, dtype, remat and scan the config's."""
  enc_cfg, enc_params = loader.read(config.init_checkpoint, "encoder")
  cfg = enc_cfg.replace(dtype=config.model.dtype, scan_layers=config.model.scan_layers,
                        remat=config.model.remat, **_dropout(enc_cfg, config.model))
  if config.max_seq_length > cfg.max_length:
    raise errors.ConfigError(f"max_seq_length {config.max_seq_length} exceeds the checkpoint's "
                      f"{cfg.max_length} positions: lower --config.max_seq_length.")
  tok = Tokenizer.from_path(config.vocab_path, config.get("lowercase"))
  if not formats.vocabulary_fits(cfg, tok.vocab_size):
    raise errors.ConfigError(f"vocab {config.vocab_path} has {tok.vocab_size} tokens, the checkpoint "
                      f"{cfg.vocab_size}: use the vocabulary the model was pre-trained with.")
  return cfg, enc_params, tok


def fingerprint(tree: Any) -> str:
  """A digest of a tree of arrays (names, dtypes, shapes and bytes)."""
  h = hashlib.blake2b(digest_size=16)
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}:{a.dtype}:{a.shape};".encode())
    if a.size:  # (memoryview cannot cast an empty array; it adds no bytes anyway)
      h.update(memoryview(a).cast("B"))
  return h.hexdigest()


def _inputs(task: tasks.TaskData, enc_params) -> dict[str, str]:
  """What a fine-tuning run is made from, by content (Trainer.inputs): rerunning a workdir
  with other data, labels or initial weights is refused, wherever the files now are."""
  # The encoded examples reflect every data field (files, columns, max_seq_length, vocab).
  return {"training examples": fingerprint(task.train), "dev examples": fingerprint(task.eval),
          "labels": fingerprint(np.array(json.dumps(task.labels))),
          "initial weights": fingerprint(enc_params)}


def packs(config: ml_collections.ConfigDict, cfg) -> bool:
  """Whether a run with config.packing unset packs each batch of examples (configs/finetune.py
  add_packing): a classification task, batches counted in examples, a head that reads the
  fine-tuned encoder and a bidirectional model (a left-to-right one pools its last token).
  _batches then keeps it only where it saves rows."""
  return (tasks.TASKS[config.task].packing == "examples"
          and config.get("packed_batch") == "examples" and heads.FeatureBased.of(config).plain
          and not getattr(cfg, "causal", False))


def _batches(config: ml_collections.ConfigDict, train: dict[str, np.ndarray], packing: str,
             num_devices: int, auto: bool = False) -> EpochIterator | PackedPairBatches:
  """This host's training batches of every epoch; fails when an epoch has no full batch.
  `packing`: what config.packing packs (tasks.Task.packing; "" unpacked); `auto`: packing
  chosen by the job (config.packing unset), dropped where it saves under a tenth of the
  rows."""
  n_train, B = len(train["input_ids"]), config.global_batch_size
  per_batch = packing == "texts" or (packing == "examples" and
                                     config.get("packed_batch", "rows") == "examples")
  packed = packing == "examples" and not per_batch
  if per_batch and n_train >= B:
    t = time.perf_counter()
    chunk = config.get("grad_cache_chunk", 0) or 1  # the gradient cache's chunks: of rows
    batches = (PackedPairBatches if packing == "texts" else PackedExampleBatches)(
        train, global_batch_size=B, num_epochs=config.num_epochs, seed=config.seed,
        max_per_row=config.max_examples_per_row,
        row_multiple=math.lcm(max(num_devices // jax.process_count(), 1), chunk),  # per host
        process_index=jax.process_index(), process_count=jax.process_count(),
        no_duplicates=config.get("no_duplicates", False))
    _check_deduplicated(batches, n_train, B)
    texts = batches.texts_per_batch
    if auto and batches.rows * 10 > B * 9:
      logging.info("Packing: off (each batch's %d examples need %d rows of %d; "
                   "--config.packing=True packs them anyway).", texts, batches.rows, B)
    else:
      logging.info("Packing: each batch's %d %s in %d rows of %d tokens (%.0f%% of them real "
                   "on average), planned in %.1fs%s.", texts, packing, batches.rows,
                   batches.row_length,
                   100 * texts * batches.tokens_real / (batches.rows * batches.row_length),
                   time.perf_counter() - t,
                   "; config.packing unset: --config.packing=False turns it off" if auto else "")
      return batches
  batches = EpochIterator(train, global_batch_size=B, num_epochs=config.num_epochs,
                          seed=config.seed, max_seq_length=config.max_seq_length,
                          max_examples_per_row=config.max_examples_per_row if packed else 0,
                          process_index=jax.process_index(), process_count=jax.process_count(),
                          no_duplicates=config.get("no_duplicates", False))
  _check_deduplicated(batches, n_train, B)
  steps, rows = batches.steps_per_epoch, batches.rows_per_epoch
  if packed:
    lengths = train["input_mask"].sum(-1)
    logging.info("Packing: %d examples -> %s rows an epoch (%.2f examples a row, %.0f%% of tokens "
                 "real), %s steps of %d rows.", n_train, rows, n_train / max(np.mean(rows), 1),
                 100 * lengths.sum() / (np.mean(rows) * config.max_seq_length), steps, B)
    if min(steps, default=1) == 0:
      raise errors.ConfigError(f"{n_train} training examples pack into {min(rows)} rows, fewer than one batch "
                        f"of {B} rows: lower global_batch_size.")
  elif n_train // B == 0:
    raise errors.ConfigError(f"{n_train} training examples is fewer than one batch of {B}: lower "
                      "--config.global_batch_size.")
  return batches


def _check_deduplicated(batches: EpochIterator | PackedBatches, n_train: int, B: int) -> None:
  """Logs what keeping repeated texts out of each batch (config.no_duplicates) did; an epoch
  left without a batch is a ConfigError."""
  if not batches.deduplicated:
    return
  moved, dropped = (list(x) for x in zip(*batches.deduplicated))
  logging.info("No text repeats within a batch (anchors, positives and hard negatives alike, as "
               "sentence-transformers' NoDuplicatesBatchSampler; --config.no_duplicates=False "
               "turns it off): of the %d pairs, each epoch's moved to a later batch: %s; dropped "
               "at its end: %s (a plain shuffle drops %d).", n_train, moved, dropped, n_train % B)
  if min(batches.steps_per_epoch) == 0:
    raise errors.ConfigError(
        f"The {n_train} training pairs repeat their texts too much to fill one batch of {B} "
        "without a text twice: lower --config.global_batch_size (or set "
        "--config.no_duplicates=False).")


def _encoder_features(task: tasks.TaskData, encoder_params, batch_size: int) -> np.ndarray:
  """The frozen encoder's features of every training example (heads.cached_features: no
  dropout), computed once, `batch_size` at a time, on this host (config.cache_features)."""
  start = time.time()
  params = jax.device_put(multihost_utils.process_allgather(encoder_params, tiled=True))
  run = jax.jit(lambda p, *a: heads.cached_features(task.model, p, *a))
  inputs = [task.train[k] for k in features.TEXT]
  n = len(inputs[0])
  out = None
  for lo in range(0, n, batch_size):
    rows = np.arange(lo, lo + batch_size) % n  # the last batch padded: one compiled shape
    got = np.asarray(run(params, *(x[rows] for x in inputs)))[:min(batch_size, n - lo)]
    if out is None:
      out = np.empty((n,) + got.shape[1:], got.dtype)
    out[lo:lo + len(got)] = got
  logging.info("Cached the frozen encoder's features of %d training examples: %s %s, %.0f MB, "
               "%.1f s.", n, out.shape[1:], out.dtype, out.nbytes / 2**20, time.time() - start)
  return out


class _DevEvaluation:
  """After each epoch: dev outputs on every host, metrics to the log, TensorBoard and
  metrics.json (history kept across reruns), and best/ + predictions on improvement."""

  def __init__(self, config, workdir: str, task: tasks.TaskData, trainer: trainer_lib.Trainer,
               cfg: Any, writer, epoch_ends: list[int], saved: dict):
    self.config, self.out_dir, self.task, self.trainer = config, fileio.path(workdir), task, trainer
    self.cfg, self.writer, self.epoch_ends = cfg, writer, epoch_ends
    self.best, self.history = saved.get("best", {}), saved.get("epochs", [])

  def __call__(self, step: int, state) -> None:
    task, config = self.task, self.config
    epoch = self.epoch_ends.index(step) + 1
    sums, outputs = _dev_outputs(self.trainer, state.params, task.eval, list(task.train),
                                 config.eval_batch_size)
    result, write = task.evaluate(outputs)
    if task.evaluate_params:  # every host evaluates the whole model (its params gathered)
      params = state.params if jax.process_count() == 1 else \
          multihost_utils.process_allgather(state.params, tiled=True)
      result = {**result, **task.evaluate_params(params)}
    result = {k: float(v) for k, v in result.items()}
    loss = task.objective.summarize(sums)["loss"]
    logging.info("epoch %d dev: %s (loss %.4f)", epoch, result, loss)
    self.writer.write_scalars(step, {"dev/loss": loss, **{f"dev/{k}": v for k, v in result.items()}})
    # A run killed between this evaluation and its checkpoint evaluates the epoch again.
    self.history = [h for h in self.history if h.get("epoch") != epoch] + [
        {"epoch": epoch, "step": step, **result}]
    if not self.best or result[task.main_metric] > self.best[task.main_metric]:
      self.best = {"epoch": epoch, "step": step, **result}
      finetuned.save(best_dir.of(self.out_dir), state.params, self.cfg, config, task.labels)
      if jax.process_index() == 0:  # shared files: one writer, every host reads them
        write(self.out_dir)
    if jax.process_index() == 0:  # atomic: a kill or a full disk leaves the previous one
      fileio.write_json(self.out_dir / METRICS_FILE,
                        {"task": config.task, "main_metric": task.main_metric, "best": self.best,
                         "epochs": self.history})


def finetune(config: ml_collections.ConfigDict, workdir: str, devices=None) -> dict[str, float]:
  """Fine-tunes config.init_checkpoint on config.task; returns the best dev metrics.
  `devices`: the devices its mesh spans (default: all; the suite runs several jobs on
  device groups). main.run holds the workdir's lock."""
  fileio.path(workdir).mkdir(parents=True, exist_ok=True)
  packed = check_config(config)
  saved_metrics = _read_metrics(fileio.path(workdir) / METRICS_FILE)  # before any work
  cfg, enc_params, tok = _load(config)
  task = tasks.TASKS[config.task].data(config, tok, cfg)
  auto = packed is None
  if auto:
    packed = packs(config, cfg)
  packing = tasks.TASKS[config.task].packing if packed else ""
  num_devices = len(devices or jax.devices())
  batches = _batches(config, task.train, packing, num_devices, auto)
  total = sum(batches.steps_per_epoch)
  epoch_ends = list(np.cumsum(batches.steps_per_epoch))
  epoch_of = lambda step: next(i for i, end in enumerate(epoch_ends) if step <= end) + 1
  cache = bool(config.get("cache_features", False))
  objective = task.objective.replace(
      keyword_inputs=task.objective.keyword_inputs + (heads.CACHED,)) if cache else task.objective
  if isinstance(batches, PackedBatches):  # FLOPs of the rows computed, not of the examples
    objective = objective.replace(flops=objectives.rows_flops(batches.rows))
  trainer = trainer_lib.build(config, task.model, objective, task.train, workdir,
                              eval_batch_size=config.eval_batch_size, total_steps=total,
                              devices=devices, inputs=_inputs(task, enc_params),
                              eval_outputs=True,
                              log_prefix=lambda step: f"epoch {epoch_of(step)} ")
  # The pre-trained encoder in place; the head stays new (and the pooler, for checkpoints
  # without one: BertForMaskedLM, BertModel(add_pooling_layer=False), as transformers does).
  state, data_state = trainer.restore_or_init((cfg, enc_params), target="encoder",
                                              name=config.init_checkpoint)
  if cache:
    batches = _batches(config, {**task.train, heads.CACHED: _encoder_features(
        task, state.params["bert"], config.eval_batch_size)}, packing, num_devices, auto)
  if data_state is not None:
    batches.set_state(data_state)
  if int(jax.device_get(state.step)):
    logging.info("Resumed fine-tuning at step %d.", int(jax.device_get(state.step)))
  dev = _DevEvaluation(config, workdir, task, trainer, cfg, trainer.writer, epoch_ends,
                       saved_metrics)
  is_epoch_end = lambda step: step in epoch_ends
  result = trainer_lib.run(trainer, state, batches, num_steps=total, evaluate=dev,
                           eval_at=is_epoch_end, save_at=is_epoch_end)
  logging.info("Best dev %s: %s", task.main_metric, dev.best)
  logging.info("Outputs in %s: best/ (epoch %s), metrics.json, the dev predictions, checkpoints "
               "(step %d); TensorBoard: tensorboard --logdir=%s", workdir, dev.best.get("epoch"),
               result.step, workdir)
  return dev.best


METRICS_FILE = "metrics.json"


class UnreadableMetricsError(errors.UserError, ValueError):
  """A workdir's metrics.json exists but cannot be read: continuing would lose its history."""


def _read_metrics(path) -> dict:
  """The dev history of earlier epochs ({} before the first). One that exists but does not
  read is an error: treated as empty, the rerun would drop the earlier epochs' results and
  let a worse epoch replace best/."""
  if not path.exists():
    return {}
  try:
    saved = json.loads(path.read_text())
    if not isinstance(saved, dict) or not isinstance(saved.get("epochs", []), list):
      raise ValueError("not the {task, main_metric, best, epochs} record fine-tuning writes")
  except (ValueError, UnicodeDecodeError) as e:
    raise UnreadableMetricsError(
        f"{path} is unreadable ({str(e).splitlines()[0][:120]}): it holds this run's dev "
        "results per epoch and which epoch best/ holds, so the run cannot go on without it; "
        "nothing was changed. Put back a good copy of it, or delete it to continue without "
        "the earlier epochs' results (the next evaluated epoch then replaces best/).") from None
  return saved
