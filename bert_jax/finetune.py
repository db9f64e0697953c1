"""Fine-tuning: GLUE / custom classification, SQuAD v1.1/v2.0, CoNLL NER, SWAG.

    python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
        --config.data_dir=glue/CoLA --config.vocab_path=vocab.txt --workdir=/tmp/cola

Each task picks its head, objective, features and dev evaluation; `bert_jax/trainer.py`
does the rest as for pre-training: sharded state, gradient accumulation, remat, Orbax
checkpoints (resume after a kill, SIGTERM save), progress lines with tokens/s, MFU and
ETA, TensorBoard curves. The batches come from input_pipeline/epochs.py (shuffled per
epoch, each host feeding its rows of the global batch). After every epoch it evaluates
on the dev set, keeps the best parameters (`workdir/best`), and writes predictions in
each task's submission format plus `metrics.json` (process 0 writes, every host reads).

With `config.packing` (classification only), each epoch's shuffled training
examples are packed several to a row (input_pipeline/packing.py): attention is
block-diagonal, positions restart per example and every example is classified
from its own [CLS], so the loss equals that of the same examples unpacked while
far fewer padding tokens are computed. Steps and resume offsets then count rows;
loss/accuracy still count examples. Evaluation and prediction stay unpacked.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import convert, heads, scoring
from bert_jax import objectives
from bert_jax import trainer as trainer_lib
from bert_jax.model import BertConfig
from input_pipeline import errors, features, fileio
from input_pipeline import glue, squad, tagging
from input_pipeline.epochs import EpochIterator
from input_pipeline.tokenizer import Tokenizer

PACKABLE_TASKS = ("glue", "custom")

# The config fields naming each task's input files (or their directory), with what they hold.
_INPUT_FIELDS = {
    "glue": {"data_dir": "the task's directory as GLUE distributes it (train.tsv, dev.tsv), "
                         "or tfds[:DIR] for a locally prepared TFDS copy"},
    "custom": {"train_file": "the labelled training file: CSV/TSV with a header, or JSONL",
               "eval_file": "the labelled dev file evaluated after every epoch: CSV/TSV with a "
                            "header, or JSONL"},
    "squad": {"train_file": "the training set, e.g. train-v1.1.json / train-v2.0.json",
              "eval_file": "the dev set, e.g. dev-v1.1.json / dev-v2.0.json"},
    "conll": {"data_dir": "the directory holding config.train_file and config.eval_file "
                          "(train.txt, valid.txt)"},
    "swag": {"data_dir": "the directory holding config.train_file and config.eval_file "
                         "(train.csv, val.csv)"},
}


MIN_SEQ_LENGTH = 5  # [CLS] a [SEP] b [SEP] with a token of each segment


@dataclasses.dataclass
class TaskData:
  """Everything task-specific: features, the model head, loss and decoding."""
  model: nn.Module
  objective: objectives.Objective
  train: dict[str, np.ndarray]
  eval: dict[str, np.ndarray]
  evaluate: Callable[[Any], tuple[dict[str, float], Callable[[str], None]]]  # outputs -> (metrics, writer)
  main_metric: str
  labels: tuple | None = None  # class / tag names, saved beside the best params for predict


def _glue_metrics(names, preds, labels, scores=None):
  fns = {"accuracy": lambda: scoring.accuracy(preds, labels), "f1": lambda: scoring.f1_binary(preds, labels),
         "mcc": lambda: scoring.matthews_corrcoef(preds, labels),
         "pearson": lambda: scoring.pearson(scores, labels), "spearman": lambda: scoring.spearman(scores, labels)}
  return {n: float(fns[n]()) for n in names}


def classification_task(config, tok, cfg: BertConfig) -> TaskData:
  if config.task == "glue":
    spec = glue.GLUE[config.glue_task]
    if config.data_dir.startswith("tfds"):  # "tfds" or "tfds:<tensorflow_datasets dir>"
      tfds_dir = config.data_dir.partition(":")[2] or None
      read = lambda split: glue.read_tfds_glue(config.glue_task, split, tfds_dir, config.tfds_name or None)
    else:
      read = lambda split: glue.read_glue(config.glue_task, config.data_dir, split)
    train_ex, eval_ex = read("train"), read(config.eval_split)
    labels, metrics, name = spec.labels, spec.metrics, spec.submission_name
  else:  # custom CSV / TSV / JSONL
    read = lambda path: glue.read_custom(path, config.text_a_column, config.label_column,
                                         config.text_b_column or None)
    train_ex, eval_ex = read(config.train_file), read(config.eval_file)
    # Declared (config.labels) or inferred from train, each label seen twice at least: a
    # stray label is an error naming its file and line, never a silent extra class.
    labels = glue.label_set(train_ex, config.labels, config.train_file)
    glue.check_labels(eval_ex, labels, config.eval_file)
    metrics, name = ("accuracy",) if len(labels) > 2 else ("accuracy", "f1"), "predictions"
  regression = labels is None
  if not regression:
    _log_labels(config, labels, train_ex)
  model = heads.BertForSequenceClassification(cfg, num_labels=1 if regression else len(labels))
  L = config.max_seq_length
  eval_feats = glue.encode_examples(eval_ex, tok, L, labels)

  def evaluate(logits):
    scores = logits[:, 0] if regression else None
    preds = scores if regression else np.argmax(logits, -1)
    gold = eval_feats["labels"]
    result = _glue_metrics(metrics, preds, gold, scores)

    def write(out_dir):
      rows = [f"{ex.guid}\t{p:.3f}\n" if regression else f"{ex.guid}\t{labels[int(p)]}\n"
              for ex, p in zip(eval_ex, preds)]
      (out_dir / f"{name}.tsv").write_text("index\tprediction\n" + "".join(rows))
    return result, write

  return TaskData(model, objectives.supervised(heads.classification_sums, "example_weights"),
                  glue.encode_examples(train_ex, tok, L, labels), eval_feats, evaluate, metrics[0],
                  labels=tuple(labels) if labels is not None else None)


def squad_task(config, tok, cfg: BertConfig) -> TaskData:
  train_ex = squad.read_squad(config.train_file)
  eval_ex = squad.read_squad(config.eval_file)
  conv = functools.partial(squad.convert_examples, tokenizer=tok, max_seq_length=config.max_seq_length,
                           doc_stride=config.doc_stride, max_query_length=config.max_query_length)
  train_feats = {k: v for k, v in conv(train_ex).items()
                 if k in features.TEXT + ("start_positions", "end_positions")}
  eval_feats = conv(eval_ex)
  v2 = config.version_2_with_negative
  too_long = squad.answers_over_length(eval_ex, tok, config.max_answer_length)
  if too_long["answers"]:
    logging.warning("%d gold answers (%d questions with no shorter one) are longer than "
                    "max_answer_length=%d tokens (the longest: %d) and cannot be predicted "
                    "exactly; raise --config.max_answer_length to reach them.",
                    too_long["answers"], too_long["examples"], config.max_answer_length,
                    too_long["longest"])

  def evaluate(outputs):
    start, end = outputs
    preds, null_diffs, nbest = squad.decode_answers(
        eval_ex, eval_feats, start, end, n_best=config.n_best_size,
        max_answer_length=config.max_answer_length, version_2=v2, null_threshold=config.null_score_threshold)
    gold = {e.qid: list(e.answers) for e in eval_ex}
    result = scoring.squad_scores(preds, gold, na_probs=null_diffs if v2 else None)
    # Questions whose every gold answer exceeds max_answer_length (unreachable spans).
    result["answers_over_max_length"] = too_long["examples"]

    def write(out_dir):
      for fname, obj in (("predictions.json", preds), ("nbest_predictions.json", nbest)) + (
          (("null_odds.json", null_diffs),) if v2 else ()):
        (out_dir / fname).write_text(json.dumps(obj, indent=1))
    return result, write

  return TaskData(heads.BertForQuestionAnswering(cfg),
                  objectives.supervised(heads.span_sums, "example_weights"),
                  train_feats, eval_feats, evaluate, "f1")


def conll_task(config, tok, cfg: BertConfig) -> TaskData:
  train_s = tagging.read_conll(fileio.join(config.data_dir, config.train_file))
  eval_s = tagging.read_conll(fileio.join(config.data_dir, config.eval_file))
  if config.tag_scheme == "iob1":  # train on IOB2 targets; scores read both
    train_s = [(w, tagging.iob1_to_iob2(t)) for w, t in train_s]
    eval_s = [(w, tagging.iob1_to_iob2(t)) for w, t in eval_s]
  labels = sorted({t for _, tags in train_s + eval_s for t in tags})
  L = config.max_seq_length
  eval_feats = tagging.encode_conll(eval_s, tok, L, labels)

  def evaluate(logits):
    pred_ids = np.argmax(logits, -1)
    pred_tags = []
    for i, (words, _) in enumerate(eval_s):
      tags = ["O"] * len(words)
      for pos in np.nonzero(eval_feats["word_index"][i] >= 0)[0]:
        tags[eval_feats["word_index"][i, pos]] = labels[pred_ids[i, pos]]
      pred_tags.append(tags)
    result = scoring.ner_scores(pred_tags, [t for _, t in eval_s])

    def write(out_dir):
      (out_dir / "predictions.txt").write_text("".join(
          "".join(f"{w} {g} {p}\n" for w, g, p in zip(words, gold, pred)) + "\n"
          for (words, gold), pred in zip(eval_s, pred_tags)))
    return result, write

  return TaskData(heads.BertForTokenClassification(cfg, num_labels=len(labels)),
                  objectives.supervised(heads.token_sums, "label_weights"),
                  tagging.encode_conll(train_s, tok, L, labels), eval_feats, evaluate, "f1",
                  labels=tuple(labels))


def swag_task(config, tok, cfg: BertConfig) -> TaskData:
  train_ex = tagging.read_swag(fileio.join(config.data_dir, config.train_file))
  eval_ex = tagging.read_swag(fileio.join(config.data_dir, config.eval_file))
  L = config.max_seq_length
  eval_feats = tagging.encode_swag(eval_ex, tok, L)

  def evaluate(scores):
    preds = np.argmax(scores, -1)
    result = {"accuracy": scoring.accuracy(preds, eval_feats["labels"])}

    def write(out_dir):
      (out_dir / "predictions.csv").write_text(
          "id,pred\n" + "".join(f"{e['id']},{int(p)}\n" for e, p in zip(eval_ex, preds)))
    return result, write

  return TaskData(heads.BertForMultipleChoice(cfg),
                  objectives.supervised(heads.classification_sums, "example_weights"),
                  tagging.encode_swag(train_ex, tok, L), eval_feats, evaluate, "accuracy")


TASKS = {"glue": classification_task, "custom": classification_task, "squad": squad_task,
         "conll": conll_task, "swag": swag_task}


def load_encoder(path: str) -> tuple[BertConfig, Any]:
  """Encoder config + params of any checkpoint (convert.load_params): a pre-training
  or fine-tuning workdir of ours, an export, HuggingFace or Google TF."""
  cfg, params, _ = convert.load_params(path, target="encoder")
  return cfg, params


def _dev_outputs(trainer: trainer_lib.Trainer, params, feats, keys, batch_size: int):
  """(metric sums, model outputs) of every dev feature, on every host, through the trainer's
  eval step. Each host feeds its rows of each global batch of `batch_size`; the last batch
  is padded with rows weighing 0 (outputs cut to the real rows)."""
  n = len(feats["input_ids"])
  b = batch_size // jax.process_count()
  lo = jax.process_index() * b
  outs, sums = [], None
  with trainer.activate():
    for i, start in enumerate(range(0, n, batch_size)):
      rows = np.arange(start, start + batch_size)[lo:lo + b]
      batch = {k: feats[k][rows % n] for k in keys}
      real = (rows < n).astype(np.float32)
      batch["example_weights"] = batch.get("example_weights", 1) * real
      if "label_weights" in batch:
        batch["label_weights"] = batch["label_weights"] * real[:, None]
      m, out = trainer.eval_step(params, trainer.to_global(batch),
                                 jax.random.fold_in(trainer.eval_rng, i))
      sums = m if sums is None else jax.tree.map(np.add, sums, m)
      take = min(batch_size, n - start)
      outs.append(jax.tree.map(lambda x: np.asarray(x)[:take], jax.device_get(out)))
  sums = {k: float(v) for k, v in jax.device_get(sums).items()}
  return sums, jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def _log_labels(config, labels: tuple, train_ex) -> None:
  """The classes and how many training examples each has (a declared class without any
  is a warning)."""
  counts = glue.label_counts(train_ex)
  counts = {l: counts.get(l, 0) for l in labels}
  where = config.train_file if config.task == "custom" else f"{config.glue_task} train"
  source = ("declared in config.labels" if config.task == "custom" and glue.parse_labels(config.labels)
            else "of the task" if config.task == "glue" else "inferred from the training file")
  logging.info("%d labels (%s); training examples per label in %s: %s", len(labels), source, where,
               counts)
  empty = [l for l, n in counts.items() if not n]
  if empty:
    logging.warning("Labels %s have no training examples in %s: the model cannot learn them.",
                    empty, where)


def check_config(config: ml_collections.ConfigDict) -> bool:
  """Fails early on a config fine-tuning cannot run (unset fields, missing checkpoint or
  input files), naming the field to set; returns whether it packs."""
  if not config.init_checkpoint:
    raise errors.ConfigError("Fine-tuning needs --config.init_checkpoint (a pre-training workdir of ours, "
                      "a converted checkpoint, a HuggingFace directory or a Google TF checkpoint).")
  if config.task not in TASKS:
    raise errors.ConfigError(f"config.task={config.task!r}: choose one of {sorted(TASKS)} or 'pretrain'.")
  trainer_lib.check_config(config)
  for field in ("global_batch_size", "eval_batch_size", "num_epochs", "max_seq_length"):
    if config[field] < 1:
      raise errors.ConfigError(f"config.{field}={config[field]}: it must be at least 1.")
  if config.max_seq_length < MIN_SEQ_LENGTH:
    raise errors.ConfigError(f"config.max_seq_length={config.max_seq_length}: at least "
                      f"{MIN_SEQ_LENGTH} tokens are needed for [CLS], [SEP] x2 and one token of "
                      "each segment (BERT: 128; 384 for SQuAD).")
  packed = bool(config.get("packing", False))
  if packed and config.task not in PACKABLE_TASKS:
    raise errors.ConfigError(f"packing is only supported for classification fine-tuning (task glue or custom), "
                      f"not task={config.task!r}: set --config.packing=False.")
  if packed and config.get("max_examples_per_row", 0) < 1:
    raise errors.ConfigError(f"max_examples_per_row must be >= 1, got {config.get('max_examples_per_row')}.")
  if not convert.checkpoint_exists(config.init_checkpoint):
    raise errors.ConfigError(f"config.init_checkpoint: {config.init_checkpoint} does not exist: pass a "
                      "pre-training or fine-tuning workdir of ours, a converted checkpoint, a "
                      "HuggingFace model directory or a Google TF checkpoint (bert_model.ckpt).")
  fields = {"vocab_path": "the vocabulary the checkpoint was trained with: vocab.txt, a "
                          "SentencePiece .model, or the directory holding it, e.g. a HuggingFace "
                          "model directory or a pre-training run's WORKDIR/vocab",
            **_INPUT_FIELDS[config.task]}
  for field, what in fields.items():
    if not config[field]:
      value = "DIR" if field == "data_dir" else "PATH"
      raise errors.ConfigError(f"config.{field} is not set: pass --config.{field}={value} ({what}).")
  for field, path in _input_files(config).items():
    if not fileio.path(path).exists():
      raise errors.ConfigError(f"config.{field}: {path} does not exist" + (
          f" (config.data_dir + config.{field})." if "data_dir" in config else "."))
  return packed


def _input_files(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Config field -> path of each input file the task reads (GLUE's reader finds its own)."""
  if config.task in ("custom", "squad"):
    return {f: config[f] for f in ("train_file", "eval_file")}
  if config.task in ("conll", "swag"):
    return {f: fileio.join(config.data_dir, config[f]) for f in ("train_file", "eval_file")}
  return {}


def _load(config: ml_collections.ConfigDict) -> tuple[BertConfig, Any, Tokenizer]:
  """(BertConfig, encoder params, tokenizer): the architecture is the checkpoint's;
  dropout, dtype, remat and scan the config's."""
  enc_cfg, enc_params = load_encoder(config.init_checkpoint)
  cfg = enc_cfg.replace(hidden_dropout_rate=config.model.hidden_dropout_rate,
                        attention_dropout_rate=config.model.attention_dropout_rate,
                        dtype=config.model.dtype, scan_layers=config.model.scan_layers,
                        remat=config.model.remat)
  if config.max_seq_length > cfg.max_position_embeddings:
    raise errors.ConfigError(f"max_seq_length {config.max_seq_length} exceeds the checkpoint's "
                      f"{cfg.max_position_embeddings} positions: lower --config.max_seq_length.")
  tok = Tokenizer.from_path(config.vocab_path, config.get("lowercase"))
  if tok.vocab_size != cfg.vocab_size:
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
    h.update(memoryview(a).cast("B"))
  return h.hexdigest()


def _inputs(task: TaskData, enc_params) -> dict[str, str]:
  """What a fine-tuning run is made from, by content (Trainer.inputs): rerunning a workdir
  with other data, labels or initial weights is refused, wherever the files now are."""
  # The encoded examples reflect every data field (files, columns, max_seq_length, vocab).
  return {"training examples": fingerprint(task.train), "dev examples": fingerprint(task.eval),
          "labels": fingerprint(np.array(json.dumps(task.labels))),
          "initial weights": fingerprint(enc_params)}


def _batches(config: ml_collections.ConfigDict, train: dict[str, np.ndarray],
             packed: bool) -> EpochIterator:
  """This host's training batches of every epoch; fails when an epoch has no full batch."""
  n_train, B = len(train["input_ids"]), config.global_batch_size
  batches = EpochIterator(train, global_batch_size=B, num_epochs=config.num_epochs,
                          seed=config.seed, max_seq_length=config.max_seq_length,
                          max_examples_per_row=config.max_examples_per_row if packed else 0,
                          process_index=jax.process_index(), process_count=jax.process_count())
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


def _with_encoder(state, enc_params, cfg: BertConfig, trainer: trainer_lib.Trainer, path: str):
  """The fresh state's params with the pre-trained encoder in place: only the head stays new
  (and the pooler, for checkpoints without one: BertForMaskedLM, BertModel(add_pooling_layer=False))."""
  params = convert.to_layout(enc_params, cfg.num_layers, cfg.scan_layers)
  if "pooler" not in params:
    logging.warning("init_checkpoint %s has no pooler: it starts from a fresh "
                    "initialisation (as transformers does for such checkpoints).", path)
    params = {**params, "pooler": jax.device_get(state.params["bert"]["pooler"])}
  bert = jax.tree.map(lambda a, x: jax.device_put(np.asarray(x, a.dtype), a.sharding),
                      trainer.abstract.params["bert"], params)
  return {**state.params, "bert": bert}


class _DevEvaluation:
  """After each epoch: dev outputs on every host, metrics to the log, TensorBoard and
  metrics.json (history kept across reruns), and best/ + predictions on improvement."""

  def __init__(self, config, workdir: str, task: TaskData, trainer: trainer_lib.Trainer,
               cfg: BertConfig, writer, epoch_ends: list[int], saved: dict):
    self.config, self.out_dir, self.task, self.trainer = config, fileio.path(workdir), task, trainer
    self.cfg, self.writer, self.epoch_ends = cfg, writer, epoch_ends
    self.best, self.history = saved.get("best", {}), saved.get("epochs", [])

  def __call__(self, step: int, state) -> None:
    task, config = self.task, self.config
    epoch = self.epoch_ends.index(step) + 1
    sums, outputs = _dev_outputs(self.trainer, state.params, task.eval, list(task.train),
                                 config.eval_batch_size)
    result, write = task.evaluate(outputs)
    result = {k: float(v) for k, v in result.items()}
    loss = task.objective.summarize(sums)["loss"]
    logging.info("epoch %d dev: %s (loss %.4f)", epoch, result, loss)
    self.writer.write_scalars(step, {"dev/loss": loss, **{f"dev/{k}": v for k, v in result.items()}})
    # A run killed between this evaluation and its checkpoint evaluates the epoch again.
    self.history = [h for h in self.history if h.get("epoch") != epoch] + [
        {"epoch": epoch, "step": step, **result}]
    if not self.best or result[task.main_metric] > self.best[task.main_metric]:
      self.best = {"epoch": epoch, "step": step, **result}
      _save_params(self.out_dir / "best", state.params, self.cfg, config, task.labels)
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
  task = TASKS[config.task](config, tok, cfg)
  batches = _batches(config, task.train, packed)
  total = sum(batches.steps_per_epoch)
  epoch_ends = list(np.cumsum(batches.steps_per_epoch))
  epoch_of = lambda step: next(i for i, end in enumerate(epoch_ends) if step <= end) + 1
  trainer = trainer_lib.build(config, task.model, task.objective, task.train, workdir,
                              eval_batch_size=config.eval_batch_size, total_steps=total,
                              devices=devices, inputs=_inputs(task, enc_params),
                              eval_outputs=True,
                              log_prefix=lambda step: f"epoch {epoch_of(step)} ")
  state, data_state = trainer.restore_or_init(
      lambda fresh: _with_encoder(fresh, enc_params, cfg, trainer, config.init_checkpoint))
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


def _save_params(path, params, cfg: BertConfig, config, labels) -> None:
  """The best parameters (head included) in the export format (convert.save_native:
  params.safetensors + bert_jax_config.json with the model's real BertConfig, so best/ is
  also an init_checkpoint), plus config.json: the labels and the task config for predict.

  config.json marks best/ complete: it is removed before the parameters are replaced and
  written after them, so a kill in between leaves a best/ that predict refuses, never one
  whose config and parameters disagree (a directory rename is not atomic on GCS)."""
  host = multihost_utils.process_allgather(params, tiled=True)  # every process takes part
  if jax.process_index() != 0:
    return
  marker = path / "config.json"
  if marker.exists():
    marker.unlink()
  if (path / "params").exists():  # the Orbax directory of an older best/, replaced here
    (path / "params").rmtree()
  convert.save_native(str(path), cfg.replace(scan_layers=False, remat="none"), host)
  marker.write_text(json.dumps({"labels": labels, "task": json.loads(config.to_json_best_effort())},
                               indent=2))
