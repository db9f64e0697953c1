"""Loads this host's share of a prepared corpus into flat in-memory arrays.

Splits: the first max(n_min, round(eval_fraction * documents)) documents of the prepared
corpus (n_min = 2 with NSP, which needs another document for NotNext, else 1) are held
out for evaluation. Since prepare deals documents round-robin to the shards (document g
is record g // S of shard g % S), they are the first records of the shards: cheap to read
for every host. "eval" gives every host all of them (hosts differ by their RNG keys);
"train" gives each host the other documents of its shard files (files[h::hosts]), or
every hosts-th training document when there are fewer files than hosts.

The returned dict is described in instances.py (tokens, sent_start, doc_sent, doc_ids,
piece_sent, piece_doc).
"""
import math

import numpy as np

from input_pipeline import instances
from input_pipeline import prepare
from input_pipeline import records

SPLITS = ("train", "eval")


def eval_document_count(num_documents: int, eval_fraction: float, nsp: bool) -> int:
  minimum = 2 if nsp else 1
  count = max(minimum, round(eval_fraction * num_documents))
  if num_documents - count < minimum:
    raise ValueError(
        f"The prepared corpus has {num_documents} documents: too few to hold out {count} "
        f"for evaluation and keep {minimum} for training. Use a larger corpus.")
  return count


def _read_shard(path: str, first: int, stop: int | None, keep=None) -> list[dict]:
  """Documents [first, stop) of a shard file (and keep(record_index) if given)."""
  chunks, start = [], 0
  for batch in records.read_documents([path]):
    index = np.arange(start, start + len(batch["token_rows"]))
    start = index[-1] + 1
    wanted = (index >= first) & (index < (stop if stop is not None else start))
    if keep is not None:
      wanted &= keep(index)
    if wanted.any():
      chunks.append({
          "tokens": batch["tokens"][np.repeat(wanted, batch["token_rows"])],
          "sentence_lengths": batch["sentence_lengths"][np.repeat(wanted,
                                                                  batch["sentence_rows"])],
          "sentence_rows": batch["sentence_rows"][wanted], "record_index": index[wanted]})
    if stop is not None and start >= stop:
      break
  return chunks


def _host_chunks(prepared_dir: str, summary: dict, split: str, n_eval: int,
                 process_index: int, process_count: int) -> list[tuple[int, dict]]:
  num_shards = summary["num_shards"]
  # Held-out documents g < n_eval are records r < ceil((n_eval - s) / S) of shard s.
  eval_in_shard = [max(0, math.ceil((n_eval - s) / num_shards)) for s in range(num_shards)]
  out = []
  for shard, name in enumerate(summary["files"]):
    path = prepared_dir.rstrip("/") + "/" + name
    if split == "eval":
      got = _read_shard(path, 0, eval_in_shard[shard]) if eval_in_shard[shard] else []
    elif num_shards >= process_count:
      mine = shard % process_count == process_index
      got = _read_shard(path, eval_in_shard[shard], None) if mine else []
    else:
      # Fewer files than hosts: deal the training documents to hosts by global index.
      keep = lambda r, s=shard: (r * num_shards + s - n_eval) % process_count == process_index
      got = _read_shard(path, eval_in_shard[shard], None, keep)
    out.extend((shard, c) for c in got)
  return out


def load_documents(prepared_dir: str, *, split: str = "train", eval_fraction: float = 0.01,
                   nsp: bool = True, process_index: int = 0, process_count: int = 1,
                   doc_piece_tokens: int = 8192) -> dict:
  """This host's documents of a split, as flat arrays (see module doc)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count}).")
  summary = prepare.load_summary(prepared_dir)
  num_docs, num_shards = summary["documents"], summary["num_shards"]
  n_eval = eval_document_count(num_docs, eval_fraction, nsp)
  chunks = _host_chunks(prepared_dir, summary, split, n_eval, process_index, process_count)
  if not chunks:
    raise ValueError(
        f"Host {process_index}/{process_count} has no {split} documents in {prepared_dir} "
        f"({num_docs} documents in {num_shards} shards); prepare more shards.")
  vocab_size = summary["vocab"]["vocab_size"]
  tokens = np.concatenate([c["tokens"] for _, c in chunks])
  sent_len = np.concatenate([c["sentence_lengths"] for _, c in chunks])
  doc_sents = np.concatenate([c["sentence_rows"] for _, c in chunks])
  corpus = {
      "tokens": tokens.astype(np.uint16 if vocab_size <= 1 << 16 else np.int32),
      "sent_start": np.concatenate([[0], np.cumsum(sent_len)]).astype(np.int64),
      "doc_sent": np.concatenate([[0], np.cumsum(doc_sents)]).astype(np.int64),
      "doc_ids": np.concatenate([c["record_index"] * num_shards + s for s, c in chunks]),
  }
  corpus["piece_sent"], corpus["piece_doc"] = instances.pieces(
      corpus["sent_start"], corpus["doc_sent"], doc_piece_tokens)
  return corpus
