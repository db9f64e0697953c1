"""Evaluation metrics for fine-tuning, in plain numpy (host side).

Accuracy, F1, Matthews correlation, Pearson/Spearman (GLUE); SQuAD v1.1/v2.0 exact
match and F1 with the official answer normalisation; entity-level NER scores with
seqeval's semantics (IOB1 and IOB2).
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Mapping, Sequence

import numpy as np


def accuracy(preds: Sequence, labels: Sequence) -> float:
  preds, labels = np.asarray(preds), np.asarray(labels)
  return float(np.mean(preds == labels)) if len(labels) else 0.0


def f1_binary(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
  preds, labels = np.asarray(preds) == positive, np.asarray(labels) == positive
  tp = float(np.sum(preds & labels))
  denom = float(np.sum(preds) + np.sum(labels))
  return 2 * tp / denom if denom else 0.0


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
  """Multi-class MCC (Gorodkin); equals the binary formula for two classes."""
  preds, labels = np.asarray(preds), np.asarray(labels)
  classes = np.union1d(preds, labels)
  index = {c: i for i, c in enumerate(classes)}
  conf = np.zeros((len(classes), len(classes)))
  for p, t in zip(preds, labels):
    conf[index[t], index[p]] += 1
  t_sum, p_sum = conf.sum(1), conf.sum(0)
  n, correct = conf.sum(), np.trace(conf)
  cov_ytyp = correct * n - np.dot(t_sum, p_sum)
  cov_ypyp = n * n - np.dot(p_sum, p_sum)
  cov_ytyt = n * n - np.dot(t_sum, t_sum)
  denom = np.sqrt(cov_ytyt * cov_ypyp)
  return float(cov_ytyp / denom) if denom else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denom) if denom else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
  """Average ranks (ties share the mean of their positions), as scipy.stats.rankdata."""
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x))
  sorted_x = x[order]
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  return pearson(_ranks(np.asarray(x, np.float64)), _ranks(np.asarray(y, np.float64)))


# ----------------------------------------------------------------------------
# SQuAD (the official evaluate-v1.1 / evaluate-v2.0 normalisation).

def normalize_answer(s: str) -> str:
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def exact_match(prediction: str, truth: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(truth))


def span_f1(prediction: str, truth: str) -> float:
  pred_tokens, truth_tokens = normalize_answer(prediction).split(), normalize_answer(truth).split()
  if not pred_tokens or not truth_tokens:
    # v2.0: both empty (no answer) is a match, otherwise 0.
    return float(pred_tokens == truth_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(truth_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]],
                 na_probs: Mapping[str, float] | None = None) -> dict[str, float]:
  """EM/F1 (in %) over questions; an empty gold list means unanswerable (v2.0).

  With `na_probs` (question -> no-answer score) also reports the threshold on it
  that maximises F1 (`best_f1`, `best_f1_thresh`), as the v2.0 evaluator does.
  """
  em, f1 = {}, {}
  for qid, golds in answers.items():
    golds = [g for g in golds if normalize_answer(g)] or [""]
    pred = predictions.get(qid, "")
    em[qid] = max(exact_match(pred, g) for g in golds)
    f1[qid] = max(span_f1(pred, g) for g in golds)
  has_ans = [q for q, g in answers.items() if any(normalize_answer(x) for x in g)]
  no_ans = [q for q in answers if q not in set(has_ans)]
  mean = lambda d, keys: 100.0 * sum(d[k] for k in keys) / len(keys) if keys else 0.0
  out = {"exact": mean(em, list(answers)), "f1": mean(f1, list(answers)), "total": len(answers)}
  if no_ans:
    out.update(HasAns_exact=mean(em, has_ans), HasAns_f1=mean(f1, has_ans), HasAns_total=len(has_ans),
               NoAns_exact=mean(em, no_ans), NoAns_f1=mean(f1, no_ans), NoAns_total=len(no_ans))
  if na_probs is not None:
    out["best_exact"], out["best_exact_thresh"] = _best_threshold(predictions, em, na_probs, answers, no_ans)
    out["best_f1"], out["best_f1_thresh"] = _best_threshold(predictions, f1, na_probs, answers, no_ans)
  return out


def _best_threshold(predictions, scores, na_probs, answers, no_ans):
  """Predict 'no answer' when na_prob > threshold; sweep thresholds (evaluate-v2.0)."""
  no_ans = set(no_ans)
  cur = best = float(len(no_ans))
  best_thresh = 0.0
  for qid in sorted(answers, key=lambda q: na_probs.get(q, 0.0)):
    if qid in no_ans:
      diff = -1.0 if predictions.get(qid, "") else 0.0
    else:
      diff = scores[qid] if predictions.get(qid, "") else 0.0
    cur += diff
    if cur > best:
      best, best_thresh = cur, na_probs.get(qid, 0.0)
  return 100.0 * best / len(answers), best_thresh


# ----------------------------------------------------------------------------
# Entity-level NER scores (seqeval's default, non-strict mode).

def _chunk_end(prev_tag, tag, prev_type, type_) -> bool:
  return (prev_tag in ("E", "S") or (prev_tag == "B" and tag in ("B", "S", "O"))
          or (prev_tag == "I" and tag in ("B", "S", "O"))
          or (prev_tag not in ("O", ".") and prev_type != type_))


def _chunk_start(prev_tag, tag, prev_type, type_) -> bool:
  return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("I", "E"))
          or (tag != "O" and prev_type != type_))


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """(type, start, end-inclusive) chunks; reads IOB1, IOB2 and IOBES alike (seqeval)."""
  entities, prev_tag, prev_type, begin = [], "O", "", 0
  for i, chunk in enumerate(list(tags) + ["O"]):
    tag, type_ = (chunk[0], chunk[2:] if len(chunk) > 1 else "") if chunk != "O" else ("O", "")
    if _chunk_end(prev_tag, tag, prev_type, type_):
      entities.append((prev_type, begin, i - 1))
    if _chunk_start(prev_tag, tag, prev_type, type_):
      begin = i
    prev_tag, prev_type = tag, type_
  return entities


def ner_scores(predictions: Iterable[Sequence[str]], labels: Iterable[Sequence[str]]) -> dict[str, float]:
  pred_set, gold_set = set(), set()
  for s, (p, g) in enumerate(zip(predictions, labels)):
    pred_set.update((s, *e) for e in get_entities(p))
    gold_set.update((s, *e) for e in get_entities(g))
  tp = len(pred_set & gold_set)
  precision = tp / len(pred_set) if pred_set else 0.0
  recall = tp / len(gold_set) if gold_set else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}
