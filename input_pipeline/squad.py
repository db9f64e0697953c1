"""SQuAD v1.1 / v2.0: JSON -> windowed features, and logits -> answer texts.

Contexts longer than the window are split into overlapping windows
(`doc_stride`); each token remembers its character span in the original
context, so a predicted token span maps straight back to the context text.
"""
from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np

from input_pipeline import features
from input_pipeline.glue import DataError, read_task_text


@dataclasses.dataclass(frozen=True)
class QAExample:
  qid: str
  question: str
  context: str
  answers: tuple[str, ...]  # Gold texts; empty for unanswerable (v2.0) or test.
  answer_start: int  # Character offset of the first answer, -1 if none.
  is_impossible: bool = False


def read_squad(path: str) -> list[QAExample]:
  """Every question of a SQuAD v1.1 / v2.0 JSON file; a file with none is a DataError."""
  text = read_task_text(path)
  try:
    data = json.loads(text)
  except ValueError as e:
    raise DataError(f"{path} is not a SQuAD file: not valid JSON ({e}).") from None
  if not isinstance(data, dict) or "data" not in data:
    raise DataError(f"{path} is not a SQuAD file: no top-level 'data' list.")
  out = []
  for article in data["data"]:
    for para in article["paragraphs"]:
      for qa in para["qas"]:
        answers = tuple(a["text"] for a in qa.get("answers", []))
        start = qa["answers"][0]["answer_start"] if qa.get("answers") else -1
        out.append(QAExample(qa["id"], qa["question"], para["context"], answers, start,
                             bool(qa.get("is_impossible", False))))
  if not out:
    raise DataError(f"{path} holds no questions: every input file needs at least one.")
  return out


def _encode_with_offsets(tokenizer, texts: list[str]):
  backend = getattr(tokenizer, "_backend", None)
  if tokenizer.kind not in ("wordpiece", "hf") or backend is None:
    raise NotImplementedError("Span QA needs character offsets, implemented for WordPiece "
                              "vocabularies and tokenizer.json tokenizers; SentencePiece QA is "
                              "not supported yet.")
  encodings = backend.encode_batch(texts, add_special_tokens=False)
  return [(e.ids, e.offsets) for e in encodings]


def _windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
  spans, start = [], 0
  while True:
    length = min(window, num_tokens - start)
    spans.append((start, length))
    if start + length >= num_tokens:
      return spans
    start += min(length, stride)


def _is_max_context(spans, span_index: int, position: int) -> bool:
  """The window where `position` has the most context on both sides (original BERT)."""
  best, best_index = None, None
  for i, (start, length) in enumerate(spans):
    if not start <= position < start + length:
      continue
    score = min(position - start, start + length - 1 - position) + 0.01 * length
    if best is None or score > best:
      best, best_index = score, i
  return best_index == span_index


def convert_examples(examples: list[QAExample], tokenizer, max_seq_length: int = 384,
                     doc_stride: int = 128, max_query_length: int = 64) -> dict[str, np.ndarray]:
  """Features [N, L] plus, per feature, its example index and token -> char offsets."""
  queries = _encode_with_offsets(tokenizer, [e.question for e in examples])
  contexts = _encode_with_offsets(tokenizer, [e.context for e in examples])
  feats = collections.defaultdict(list)
  for ex_index, (ex, (q_ids, _), (c_ids, c_offsets)) in enumerate(zip(examples, queries, contexts)):
    q_ids = list(q_ids[:max_query_length])
    window = max_seq_length - len(q_ids) - features.special_count(tokenizer, True)
    if window <= 0:
      raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context after a "
                       f"{len(q_ids)}-token question; raise it or lower max_query_length.")
    # Gold answer as a token span of the whole context.
    tok_start = tok_end = -1
    if ex.answer_start >= 0 and ex.answers:
      char_start, char_end = ex.answer_start, ex.answer_start + len(ex.answers[0])
      inside = [i for i, (s, e) in enumerate(c_offsets) if e > char_start and s < char_end]
      if inside:
        tok_start, tok_end = inside[0], inside[-1]
    spans = _windows(len(c_ids), window, doc_stride)
    for span_index, (start, length) in enumerate(spans):
      ids, segments = features.encode_pair(tokenizer, q_ids, c_ids[start:start + length])
      # Feature position of the window's first context token.
      offset = len(q_ids) + 1 + features.pair_seps(tokenizer)
      token_chars = np.full((max_seq_length, 2), -1, np.int32)
      max_context = np.zeros((max_seq_length,), bool)
      for j in range(length):
        token_chars[offset + j] = c_offsets[start + j]
        max_context[offset + j] = _is_max_context(spans, span_index, start + j)
      s_pos = e_pos = 0  # [CLS] when the answer is absent from this window.
      if tok_start >= start and tok_end < start + length and not ex.is_impossible:
        s_pos, e_pos = tok_start - start + offset, tok_end - start + offset
      pad = max_seq_length - len(ids)
      feats["input_ids"].append(ids + [tokenizer.pad_id] * pad)
      feats["segment_ids"].append(segments + [0] * pad)
      feats["input_mask"].append([1] * len(ids) + [0] * pad)
      feats["start_positions"].append(s_pos)
      feats["end_positions"].append(e_pos)
      feats["example_index"].append(ex_index)
      feats["token_chars"].append(token_chars)
      feats["max_context"].append(max_context)
  return {k: np.asarray(v, np.int32 if k not in ("max_context",) else bool) for k, v in feats.items()}


def answers_over_length(examples: list[QAExample], tokenizer, max_answer_length: int
                        ) -> dict[str, int]:
  """Gold answers longer than `max_answer_length` WordPiece tokens, which span decoding
  never predicts: {"examples": answerable examples whose every gold answer is longer
  (no exact match possible), "answers": such gold answers, "longest": tokens of the
  longest gold answer}."""
  answerable = [e for e in examples if e.answers]
  lengths = tokenizer.encode_batch([a for e in answerable for a in e.answers])
  out, i = {"examples": 0, "answers": 0, "longest": 0}, 0
  for e in answerable:
    n = [len(ids) for ids in lengths[i:i + len(e.answers)]]
    i += len(e.answers)
    out["answers"] += sum(x > max_answer_length for x in n)
    out["examples"] += min(n) > max_answer_length
    out["longest"] = max(out["longest"], max(n))
  return out


def decode_answers(examples: list[QAExample], features: dict[str, np.ndarray],
                   start_logits: np.ndarray, end_logits: np.ndarray, *, n_best: int = 20,
                   max_answer_length: int = 30, version_2: bool = False,
                   null_threshold: float = 0.0):
  """n-best span decoding; returns ({qid: text}, {qid: null_score_diff}, {qid: n-best list}).

  For v2.0 the answer is "" when score(null) - score(best span) > null_threshold.
  An example whose every candidate is invalid gets "" (never a crash).
  """
  by_example = collections.defaultdict(list)
  for f, ex_index in enumerate(features["example_index"]):
    by_example[int(ex_index)].append(f)
  predictions, null_diffs, nbest_out = {}, {}, {}
  for ex_index, ex in enumerate(examples):
    candidates, null_score = [], None
    for f in by_example.get(ex_index, []):
      s_logits, e_logits = start_logits[f], end_logits[f]
      chars, max_ctx = features["token_chars"][f], features["max_context"][f]
      score_null = float(s_logits[0] + e_logits[0])
      null_score = score_null if null_score is None else min(null_score, score_null)
      for s in np.argsort(s_logits)[::-1][:n_best]:
        for e in np.argsort(e_logits)[::-1][:n_best]:
          if chars[s][0] < 0 or chars[e][0] < 0 or not max_ctx[s] or e < s or e - s + 1 > max_answer_length:
            continue
          candidates.append((float(s_logits[s] + e_logits[e]), int(chars[s][0]), int(chars[e][1])))
    candidates.sort(key=lambda c: -c[0])
    seen, nbest = set(), []
    for score, c0, c1 in candidates:
      text = ex.context[c0:c1]
      if text not in seen:
        seen.add(text)
        nbest.append({"text": text, "score": score})
      if len(nbest) >= n_best:
        break
    best = nbest[0] if nbest else {"text": "", "score": -1e30}
    null_score = null_score if null_score is not None else 0.0
    diff = null_score - best["score"] if nbest else float("inf")
    null_diffs[ex.qid] = diff if np.isfinite(diff) else 1e30
    predictions[ex.qid] = "" if (version_2 and diff > null_threshold) or not nbest else best["text"]
    nbest_out[ex.qid] = nbest
  return predictions, null_diffs, nbest_out
