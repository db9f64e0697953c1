"""The fine-tuning tasks, one `Task` record each: what config.task names, for the
fine-tuning job (bert_jax/finetune.py), predict and the suite alike.

A record gives the config fields naming the task's input files (`fields`, `files`), its
reader, features, head, loss and dev decoding with the writer of its predictions in the
submission format (`data`), what config.packing packs (`packing`) and the predict mode that
serves a checkpoint fine-tuned for it (`mode`). A new task is one record here (a reader in
input_pipeline/ if the format is new, a head in bert_jax/heads.py if the output is new).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, Mapping

from absl import logging
import flax.linen as nn
import ml_collections
import numpy as np

from bert_jax import contrastive, embed, embed_eval, heads, objectives, scoring
from bert_jax.contrastive import SentenceEncoder
from bert_jax.models.layers import ModelConfig
from common import errors, fileio
from input_pipeline import features, glue, pairs, squad, swag, tagging

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
  # Dev metrics that need the model itself, not its outputs on the dev features (retrieval
  # over a corpus): the trained parameters -> metrics, merged with evaluate's.
  evaluate_params: Callable[[Any], dict[str, float]] | None = None


def _glue_metrics(names, preds, labels, scores=None):
  fns = {"accuracy": lambda: scoring.accuracy(preds, labels), "f1": lambda: scoring.f1_binary(preds, labels),
         "mcc": lambda: scoring.matthews_corrcoef(preds, labels),
         "pearson": lambda: scoring.pearson(scores, labels), "spearman": lambda: scoring.spearman(scores, labels)}
  return {n: float(fns[n]()) for n in names}


def glue_split(config, split: str) -> list:
  """One split of a GLUE task: its TSV in config.data_dir, or `tfds[:DIR]` (TFDS's copy)."""
  if config.data_dir.startswith("tfds"):  # "tfds" or "tfds:<tensorflow_datasets dir>"
    return glue.read_tfds_glue(config.glue_task, split, config.data_dir.partition(":")[2] or None,
                               config.get("tfds_name") or None)
  return glue.read_glue(config.glue_task, config.data_dir, split)


def _read_glue(config) -> tuple[list, list]:
  return glue_split(config, "train"), glue_split(config, config.eval_split)


def _read_custom(config) -> tuple[list, list]:
  read = lambda path: glue.read_custom(path, config.text_a_column, config.label_column,
                                       config.text_b_column or None)
  return read(config.train_file), read(config.eval_file)


def _read_squad(config) -> tuple[list, list]:
  return squad.read_squad(config.train_file), squad.read_squad(config.eval_file)


def _read_conll(config) -> tuple[list, list]:
  try:
    return tuple(tagging.read_conll(fileio.join(config.data_dir, config[f]))
                 for f in ("train_file", "eval_file"))
  except glue.MissingDataError as e:
    if not fileio.path(fileio.join(config.data_dir, "eng.train")).exists():
      raise
    raise glue.MissingDataError(f"{str(e).rstrip('.')}; {config.data_dir} holds the original "
                                "CoNLL-2003 files: --config.train_file=eng.train "
                                "--config.eval_file=eng.testa (eng.testb: the test set).") from None


def _read_swag(config) -> tuple[list, list]:
  return tuple(swag.read_swag(fileio.join(config.data_dir, config[f]))
               for f in ("train_file", "eval_file"))


def classification_task(config, tok, cfg: ModelConfig) -> TaskData:
  train_ex, eval_ex = TASKS[config.task].read(config)
  if config.task == "glue":
    spec = glue.GLUE[config.glue_task]
    labels, metrics, name = spec.labels, spec.metrics, spec.submission_name
  else:  # custom CSV / TSV / JSONL
    # Declared (config.labels) or inferred from train, each label seen twice at least: a
    # stray label is an error naming its file and line, never a silent extra class.
    labels = glue.label_set(train_ex, config.labels, config.train_file)
    glue.check_labels(eval_ex, labels, config.eval_file)
    metrics, name = ("accuracy",) if len(labels) > 2 else ("accuracy", "f1"), "predictions"
  regression = labels is None
  if not regression:
    _log_labels(config, labels, train_ex)
  model = TASKS[config.task].head(cfg, config, labels)
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


def squad_task(config, tok, cfg: ModelConfig) -> TaskData:
  train_ex, eval_ex = _read_squad(config)
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

  return TaskData(TASKS["squad"].head(cfg, config, None),
                  objectives.supervised(heads.span_sums, "example_weights"),
                  train_feats, eval_feats, evaluate, "f1")


def conll_task(config, tok, cfg: ModelConfig) -> TaskData:
  train_s, eval_s = _read_conll(config)
  if config.tag_scheme not in ("auto", "iob1", "iob2"):
    raise errors.ConfigError(f"--config.tag_scheme={config.tag_scheme!r}: auto (IOB1 tags "
                             "trained as IOB2), iob1 or iob2 (the tags as they are).")
  if config.tag_scheme != "iob2":  # train on IOB2 targets; scores read both
    converted = [(w, tagging.iob1_to_iob2(t)) for w, t in train_s]
    starts = sum(a != b for (_, t), (_, u) in zip(train_s, converted) for a, b in zip(t, u))
    if starts and config.tag_scheme == "auto":
      logging.info("%d entities of %s start with I- (IOB1, as the original CoNLL-2003 files): "
                   "trained as IOB2 (B- starts every entity; --config.tag_scheme=iob2 keeps "
                   "the tags as they are).", starts, config.train_file)
    train_s = converted
    eval_s = [(w, tagging.iob1_to_iob2(t)) for w, t in eval_s]
  labels = sorted({t for _, tags in train_s + eval_s for t in tags})
  L = config.max_seq_length
  eval_feats = tagging.encode_conll(eval_s, tok, L, labels)

  def evaluate(logits):
    pred_tags = decode_tags(logits, eval_feats["word_index"], [len(w) for w, _ in eval_s], labels)
    result = scoring.ner_scores(pred_tags, [t for _, t in eval_s])

    def write(out_dir):
      (out_dir / "predictions.txt").write_text("".join(
          "".join(f"{w} {g} {p}\n" for w, g, p in zip(words, gold, pred)) + "\n"
          for (words, gold), pred in zip(eval_s, pred_tags)))
    return result, write

  return TaskData(TASKS["conll"].head(cfg, config, labels),
                  objectives.supervised(heads.token_sums, "label_weights"),
                  tagging.encode_conll(train_s, tok, L, labels), eval_feats, evaluate, "f1",
                  labels=tuple(labels))


def swag_task(config, tok, cfg: ModelConfig) -> TaskData:
  train_ex, eval_ex = _read_swag(config)
  L = config.max_seq_length
  eval_feats = swag.encode_swag(eval_ex, tok, L)

  def evaluate(scores):
    preds = np.argmax(scores, -1)
    result = {"accuracy": scoring.accuracy(preds, eval_feats["labels"])}

    def write(out_dir):
      (out_dir / "predictions.csv").write_text(
          "id,pred\n" + "".join(f"{e['id']},{int(p)}\n" for e, p in zip(eval_ex, preds)))
    return result, write

  return TaskData(TASKS["swag"].head(cfg, config, None),
                  objectives.supervised(heads.classification_sums, "example_weights"),
                  swag.encode_swag(train_ex, tok, L), eval_feats, evaluate, "accuracy")


def _columns(text) -> tuple[str, ...]:
  """config.negative_columns: "a,b" or a tuple -> the column names."""
  items = text.split(",") if isinstance(text, str) else text
  return tuple(c.strip() for c in items if c.strip())


def _read_pairs(config) -> tuple[list, list]:
  negatives = _columns(config.negative_columns)
  train = pairs.read_pairs(config.train_file, config.anchor_column, config.positive_column,
                           negatives)
  dev = pairs.read_pairs(config.eval_file, config.eval_anchor_column or config.anchor_column,
                         config.eval_positive_column or config.positive_column, (),
                         config.score_column, pairs.DEV_FIELDS)
  if config.get("beir_dir"):  # checked with the other inputs, before any work
    embed_eval.read_queries(config.beir_dir, config.beir_split)
  return train, dev


def _ranks_of_own(anchors: np.ndarray, positives: np.ndarray, first: int) -> np.ndarray:
  """For anchors first, first + 1, ...: how many positives score above their own."""
  sims = anchors @ positives.T
  own = sims[np.arange(len(anchors)), first + np.arange(len(anchors))]
  return (sims > own[:, None]).sum(-1)


def _check_embed(config) -> None:
  """The embed task's settings that no run can use, as one ConfigError line."""
  contrastive.check_scale(config.scale)
  if config.grad_accum_steps != 1:
    raise errors.ConfigError(
        f"--config.grad_accum_steps={config.grad_accum_steps} with task=embed: in-batch "
        "negatives are the whole batch, which micro-batches would split; set it to 1.")
  if config.global_batch_size < 2:
    raise errors.ConfigError(
        f"--config.global_batch_size={config.global_batch_size} with task=embed: each anchor's "
        "negatives are the batch's other rows; use 2 rows at least (e.g. 64).")
  if config.grad_cache_chunk < 0:
    raise errors.ConfigError(f"--config.grad_cache_chunk={config.grad_cache_chunk}: texts a "
                             "chunk (0: off).")


def embed_task(config, tok, cfg: ModelConfig) -> TaskData:
  """Contrastive fine-tuning (bert_jax/contrastive.py). Dev: with a score column (STS-B's dev
  file: config.eval_anchor_column=sentence1, eval_positive_column=sentence2), the Spearman
  correlation of the pairs' cosine similarity with the scores; else each dev anchor's own
  positive ranked among every dev positive (MRR@10, recall@1). With config.beir_dir, also
  nDCG@10 / Recall@100 / MRR@10 of exact search on that BEIR-layout directory's
  config.beir_split (prefixed beir_). best/ is chosen on config.best_metric: by default
  beir_ndcg@10 with a BEIR directory, else spearman (scored dev pairs) or mrr@10."""
  _check_embed(config)
  train_p, dev_p = _read_pairs(config)
  L = config.max_seq_length
  logging.info("Embedding model: %s (what best/ records for predict --mode=embed and the "
               "sentence-transformers export).", embed.Spec(config.pooling, config.normalize, L))
  train = pairs.encode_pairs(train_p, tok, L)
  dev = pairs.encode_pairs(dev_p, tok, L, num_negatives=0 if "negative_ids" in train else None)
  scored = dev_p[0].score is not None

  def evaluate(outputs):
    a, c = (embed.l2_normalize(np.asarray(x, np.float32)) for x in outputs)
    if scored:
      cosine = np.sum(a * c[:, 0], -1)
      gold = np.array([p.score for p in dev_p])
      result = {"spearman": 100 * scoring.spearman(cosine, gold),
                "pearson": 100 * scoring.pearson(cosine, gold)}
      rows = [f"{p.line}\t{x:.6f}\n" for p, x in zip(dev_p, cosine)]
    else:
      rank = np.concatenate([_ranks_of_own(a[i:i + 1024], c[:, 0], i)
                             for i in range(0, len(a), 1024)])  # 0: its own positive first
      result = {"mrr@10": 100 * float(np.mean(np.where(rank < 10, 1 / (rank + 1), 0))),
                "recall@1": 100 * float(np.mean(rank == 0))}
      rows = [f"{p.line}\t{int(r) + 1}\n" for p, r in zip(dev_p, rank)]

    def write(out_dir):
      header = "line\tcosine\n" if scored else "line\trank_of_positive\n"
      (out_dir / "dev_similarities.tsv").write_text(header + "".join(rows))
    return result, write

  retrieval = _beir_metrics(config, tok, cfg, embed.Spec(config.pooling, config.normalize, L))
  metrics = (("spearman", "pearson") if scored else ("mrr@10", "recall@1")) + (
      tuple(f"beir_{k}" for k in BEIR_METRICS) if retrieval else ())
  best = config.get("best_metric") or (metrics[2] if retrieval else metrics[0])
  if best not in metrics:
    raise errors.ConfigError(f"--config.best_metric={best!r}: this run's dev metrics are "
                             f"{', '.join(metrics)}.")
  return TaskData(SentenceEncoder(cfg, config.pooling, config.grad_cache_chunk,
                                  config.max_examples_per_row),
                  contrastive.objective(config.scale, config.symmetric,
                                        contrastive.matryoshka_dims(config.matryoshka_dims,
                                                                    cfg.hidden_size)),
                  train, dev, evaluate, best, evaluate_params=retrieval)


BEIR_METRICS = (f"ndcg@{embed_eval.NDCG_AT}", f"recall@{embed_eval.RECALL_AT}",
                f"mrr@{embed_eval.MRR_AT}")


def _beir_metrics(config, tok, cfg: ModelConfig, spec: embed.Spec):
  """config.beir_dir's retrieval metrics as a function of the parameters (None without one);
  its queries and judgements read (and checked) now, before any training."""
  if not config.get("beir_dir"):
    return None
  queries = embed_eval.read_queries(config.beir_dir, config.beir_split)
  logging.info("Dev retrieval: %d queries of %s (qrels/%s.tsv) after every epoch.",
               len(queries[1]), config.beir_dir, config.beir_split)

  def retrieval(params):
    got = embed_eval.retrieval(cfg, params, tok, spec, config.beir_dir, config.beir_split,
                               batch_size=config.eval_batch_size, queries=queries)
    return {f"beir_{k}": v for k, v in got.items()}
  return retrieval


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


def decode_tags(logits_BLC: np.ndarray, word_index_BL: np.ndarray, num_words: list[int],
                labels) -> list[list[str]]:
  """Tag names per word: each word's first WordPiece (word_index >= 0) decides its tag;
  words cut off by max_seq_length are "O"."""
  pred_ids = np.argmax(logits_BLC, -1)
  out = []
  for i, n in enumerate(num_words):
    tags = ["O"] * n
    for pos in np.nonzero(word_index_BL[i] >= 0)[0]:
      tags[word_index_BL[i, pos]] = labels[pred_ids[i, pos]]
    out.append(tags)
  return out


@dataclasses.dataclass(frozen=True)
class Task:
  """One fine-tuning task: see the module doc."""
  data: Callable[[ml_collections.ConfigDict, Any, ModelConfig], TaskData]
  read: Callable[[ml_collections.ConfigDict], tuple[list, list]]  # (train, dev) examples
  # (encoder config, task config, labels or None) -> the model: fine-tuning and predict build
  # it here (the task config is a ConfigDict, or the dict a run saved in best/config.json).
  head: Callable[[ModelConfig, Mapping[str, Any], Any], nn.Module]
  fields: Mapping[str, str]  # config fields naming its input files -> what they hold
  files: Callable[[ml_collections.ConfigDict], dict[str, str]] = lambda config: {}
  # What config.packing packs: "examples" (each epoch's examples several to a row; a batch
  # counts rows), "texts" (each batch's texts several to a row; a batch counts pairs), or
  # "" (packing does not apply).
  packing: str = ""
  mode: str | None = None  # predict --mode serving a checkpoint fine-tuned for it
  # The dev prediction files its writer makes (in the submission format).
  predictions: Callable[[ml_collections.ConfigDict], tuple[str, ...]] = lambda config: ()


def _files_in(*fields: str, directory: bool = False):
  """Config fields -> the paths they name (joined to config.data_dir when `directory`)."""
  def files(config):
    return {f: fileio.join(config.data_dir, config[f]) if directory else config[f]
            for f in fields}
  return files


_IN_DATA_DIR = "the directory holding config.train_file and config.eval_file"


def _classifier(cfg: ModelConfig, config, labels) -> nn.Module:
  """Softmax over the labels, or regression (one output) when the task has none (STS-B)."""
  return heads.BertForSequenceClassification(cfg, num_labels=1 if labels is None else len(labels),
                                             how=heads.FeatureBased.of(config))

TASKS: dict[str, Task] = {
    "glue": Task(classification_task, _read_glue, _classifier, {
        "data_dir": "the task's directory as GLUE distributes it (train.tsv, dev.tsv), or "
                    "tfds[:DIR] for a locally prepared TFDS copy"},
        packing="examples", mode="classify",
        predictions=lambda config: (glue.GLUE[config.glue_task].submission_name + ".tsv",)),
    "custom": Task(classification_task, _read_custom, _classifier, {
        "train_file": "the labelled training file: CSV/TSV with a header, or JSONL",
        "eval_file": "the labelled dev file evaluated after every epoch: CSV/TSV with a "
                     "header, or JSONL"},
        files=_files_in("train_file", "eval_file"), packing="examples", mode="classify",
        predictions=lambda config: ("predictions.tsv",)),
    "squad": Task(squad_task, _read_squad,
                  lambda cfg, config, labels: heads.BertForQuestionAnswering(
                      cfg, how=heads.FeatureBased.of(config)), {
        "train_file": "the training set, e.g. train-v1.1.json / train-v2.0.json",
        "eval_file": "the dev set, e.g. dev-v1.1.json / dev-v2.0.json"},
        files=_files_in("train_file", "eval_file"), mode="qa",
        predictions=lambda config: ("predictions.json",) + (
            ("null_odds.json",) if config.version_2_with_negative else ())),
    "conll": Task(conll_task, _read_conll, lambda cfg, config, labels:
                  heads.BertForTokenClassification(cfg, num_labels=len(labels),
                                                   how=heads.FeatureBased.of(config)),
                  {"data_dir": _IN_DATA_DIR + " (train.txt, valid.txt)"},
                  files=_files_in("train_file", "eval_file", directory=True), mode="tag",
                  predictions=lambda config: ("predictions.txt",)),
    "embed": Task(embed_task, _read_pairs, lambda cfg, config, labels: SentenceEncoder(
                      cfg, config["pooling"]), {
        "train_file": "the training pairs: JSON Lines, CSV / TSV with a header, or Parquet, "
                      "with config.anchor_column, positive_column and any negative_columns",
        "eval_file": "the dev pairs, or scored pairs (STS-B's dev.tsv) whose Spearman "
                     "correlation picks best/"},
        files=_files_in("train_file", "eval_file"), packing="texts", mode="embed",
        predictions=lambda config: ("dev_similarities.tsv",)),
    "swag": Task(swag_task, _read_swag, lambda cfg, config, labels: heads.BertForMultipleChoice(
                     cfg, how=heads.FeatureBased.of(config)),
                 {"data_dir": _IN_DATA_DIR + " (train.csv, val.csv)"},
                 files=_files_in("train_file", "eval_file", directory=True),
                 predictions=lambda config: ("predictions.csv",)),
}


def modes() -> dict[str, tuple[str, ...]]:
  """predict --mode -> the tasks whose checkpoints it serves."""
  out: dict[str, tuple[str, ...]] = {}
  for name, task in TASKS.items():
    if task.mode:
      out[task.mode] = out.get(task.mode, ()) + (name,)
  return out
