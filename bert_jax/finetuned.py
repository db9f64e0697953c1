"""A fine-tuning run's best/: written by the fine-tuning job after each epoch that improves
its dev metric (`save`), read by predict, the suite and the embedding tools (`load`), and
the predictions it serves (`classify` / `classifier_logits`, `answer`, `tag`).

best/ holds the parameters in the export format (params.safetensors and
bert_jax_config.json, so that it is also an init_checkpoint) and config.json: the labels
and the run's task config."""
from __future__ import annotations

import functools
import itertools
import json
from typing import Any, Iterable, Iterator, Mapping, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from bert_jax import best_dir
from bert_jax import formats
from bert_jax import heads
from bert_jax import loader
from bert_jax import tasks
from common import fileio
from input_pipeline import features
from input_pipeline import glue
from input_pipeline import squad
from input_pipeline import tagging

def save(path, params, cfg: Any, config, labels) -> None:
  """The best parameters (head included) in the export format (formats.save_native:
  params.safetensors + bert_jax_config.json with the model's real BertConfig, so best/ is
  also an init_checkpoint), plus config.json: the labels and the task config for predict.

  config.json marks best/ complete: it is removed before the parameters are replaced and
  written after them, so a kill in between leaves a best/ that predict refuses, never one
  whose config and parameters disagree (a directory rename is not atomic on GCS)."""
  host = multihost_utils.process_allgather(params, tiled=True)  # every process takes part
  if jax.process_index() != 0:
    return
  best_dir.unmark(path)
  if (path / "params").exists():  # the Orbax directory of an older best/, replaced here
    (path / "params").rmtree()
  formats.save_native(str(path), cfg.replace(scan_layers=False, remat="none"),
                      loader.to_layout(jax.tree.map(np.asarray, host), False))
  best_dir.mark(path, labels, json.loads(config.to_json_best_effort()))


def load(workdir: str):
  """(model config, params, saved task config, labels) from a fine-tuning run's best/."""
  best = best_dir.of(workdir)
  if not fileio.path(workdir).exists():
    raise formats.CheckpointNotFoundError(
        f"{workdir} does not exist: --checkpoint must be the workdir of a fine-tuning run.")
  if not best_dir.is_complete(best):
    raise formats.CheckpointNotFoundError(
        f"{best}/config.json not found: --checkpoint must be the workdir of a fine-tuning run (it "
        "keeps its best parameters in best/).")
  saved = best_dir.recorded(best)
  cfg, params = loader.read(str(best), "all")
  return cfg.replace(scan_layers=False, remat="none"), params, saved["task"], saved.get("labels")


@functools.lru_cache(maxsize=8)
def _classifier_fn(cfg, num_labels: int, how: heads.FeatureBased):
  module = heads.BertForSequenceClassification(cfg, num_labels=num_labels, how=how)
  return jax.jit(lambda prm, a, b, c: module.apply({"params": prm}, a, b, c))


def classify(cfg, params, task, labels, tokenizer, texts, pairs=None, batch_size: int = 32):
  """[(label, probability, all probabilities)] per text (or a score for regression)."""
  return list(iter_classify(cfg, params, task, labels, tokenizer, texts, pairs, batch_size))


def classifier_logits(cfg, params, feats: dict[str, np.ndarray], batch_size: int = 32,
                      task: Mapping[str, Any] | None = None) -> np.ndarray:
  """The classifier's logits [n, num_labels] for encoded features (glue.encode_examples),
  `batch_size` rows at a time (the last batch padded: one compiled shape); `task`: the
  fine-tuning run's saved config (its head: heads.FeatureBased)."""
  num = _num_outputs(params)
  fn = _classifier_fn(cfg, num, heads.FeatureBased.of(task or {}))
  inputs = features.TEXT
  out = [np.zeros((0, num), np.float32)]
  for start in range(0, len(feats["input_ids"]), batch_size):
    rows = [feats[k][start:start + batch_size] for k in inputs]
    padded = [np.zeros((batch_size,) + v.shape[1:], v.dtype) for v in rows]
    for p, v in zip(padded, rows):
      p[:len(v)] = v
    out.append(np.asarray(fn(params, *padded))[:len(rows[0])])
  return np.concatenate(out)


def _num_outputs(params) -> int:
  return params["classifier"]["kernel"].shape[-1]


def iter_classify(cfg, params, task, labels, tokenizer, texts: Iterable[str],
                  pairs: Sequence[str] | None = None, batch_size: int = 32) -> Iterator[tuple]:
  """(label, probability, all probabilities) per text (or ("score", value, None) for
  regression), `batch_size` texts at a time as `texts` is read."""
  num = _num_outputs(params)
  done, texts = 0, iter(texts)
  while batch := list(itertools.islice(texts, batch_size)):
    examples = [glue.Example(str(i), t, (pairs[done + i] if pairs else None), None)
                for i, t in enumerate(batch)]
    feats = glue.encode_examples(examples, tokenizer, task["max_seq_length"], labels)
    logits = classifier_logits(cfg, params, feats, batch_size, task)
    done += len(batch)
    if num == 1:
      yield from (("score", float(l[0]), None) for l in logits)
      continue
    probs = np.asarray(jax.nn.softmax(logits, -1))
    yield from ((labels[int(np.argmax(p))], float(np.max(p)), dict(zip(labels, map(float, p))))
                for p in probs)


def answer(cfg, params, task, tokenizer, question: str, context: str) -> str:
  ex = [squad.QAExample("q", question, context, (), -1)]
  feats = squad.convert_examples(ex, tokenizer, task["max_seq_length"], task["doc_stride"], task["max_query_length"])
  start, end = tasks.TASKS[task["task"]].head(cfg, task, None).apply(
      {"params": params}, feats["input_ids"], feats["segment_ids"], feats["input_mask"])
  preds, _, _ = squad.decode_answers(ex, feats, np.asarray(start), np.asarray(end),
                                     max_answer_length=task["max_answer_length"],
                                     version_2=task["version_2_with_negative"],
                                     null_threshold=task["null_score_threshold"])
  return preds["q"]


def tag(cfg, params, task, labels, tokenizer, text: str) -> list[tuple[str, str]]:
  words = text.split()
  feats = tagging.encode_conll([(words, [labels[0]] * len(words))], tokenizer, task["max_seq_length"], labels)
  logits = tasks.TASKS[task["task"]].head(cfg, task, labels).apply(
      {"params": params}, feats["input_ids"], feats["segment_ids"], feats["input_mask"])
  tags, = tasks.decode_tags(np.asarray(logits), feats["word_index"], [len(words)], labels)
  return list(zip(words, tags))
