"""This host's share of a prepared corpus: memory-mapped arrays plus its document list.

Splits: the first max(n_min, round(eval_fraction * documents)) documents of the prepared
corpus (n_min = 2 with NSP, which needs another document for NotNext, else 1) are held
out for evaluation. Since prepare deals documents round-robin to the shards (document g
is record g // S of shard g % S), they are the first records of the shards. "eval" gives
every host all of them (hosts differ by their RNG keys); "train" gives each host the other
documents of the shards s with s % hosts == host, or every hosts-th training document when
there are fewer shards than hosts. Documents are listed shard after shard, each shard in
record order (the order of the arrays on disk, store.py).

The returned dict (instances.py reads it):
  tokens      [T] memory map of every token of the corpus (uint16, or uint32);
  sent_start  [S+1] memory map, token offset of each sentence of the corpus;
  doc_first, doc_stop  [D] int64, this host's documents as sentence ranges;
  doc_ids     [D] int64, each document's index g in the corpus (for tests, tracing);
  piece_first, piece_stop  [U] int64 and piece_doc [U]: the documents cut at sentence
              boundaries into pieces of about `doc_piece_tokens` tokens, the unit of
              shuffling (instances.pieces).
Only the small per-document and per-piece arrays are in memory; start-up time and memory
do not grow with the corpus's tokens.
"""
import numpy as np

from common import errors
from input_pipeline import instances
from input_pipeline import prepare
from input_pipeline import store

SPLITS = ("train", "eval")


class TooFewDocumentsError(errors.UserError, ValueError):
  """A prepared corpus too small to split into held-out and training documents."""


def eval_document_count(num_documents: int, eval_fraction: float, nsp: bool,
                        prepared_dir: str = "") -> int:
  """How many documents are held out (module doc); TooFewDocumentsError when either split
  would have fewer than NSP needs (2: NotNext takes a segment of another document) or 1."""
  minimum = 2 if nsp else 1
  count = max(minimum, round(eval_fraction * num_documents))
  if num_documents - count < minimum:
    plural = "" if num_documents == 1 else "s"
    raise TooFewDocumentsError(
        f"The prepared corpus {prepared_dir + ' ' if prepared_dir else ''}has {num_documents} "
        f"document{plural}: too few to hold out {count} for evaluation and keep {minimum} for "
        "training. Prepare a larger corpus, or one cut into more documents: in BERT's "
        "one-sentence-per-line text a blank line ends a document, free text is one document "
        "per file (or record).")
  return count


def host_documents(shard_documents: list[int], split: str, n_eval: int,
                   process_index: int, process_count: int) -> tuple[np.ndarray, np.ndarray]:
  """(positions in the stored arrays, corpus indices g) of a host's documents (module doc)."""
  num_shards = len(shard_documents)
  first = np.concatenate([[0], np.cumsum(shard_documents)]).astype(np.int64)
  positions, ids = [], []
  for shard, count in enumerate(shard_documents):
    records = np.arange(count, dtype=np.int64)
    g = records * num_shards + shard
    if split == "eval":
      keep = g < n_eval
    elif num_shards >= process_count:
      keep = (g >= n_eval) & (shard % process_count == process_index)
    else:  # Fewer shards than hosts: deal the training documents by corpus index.
      keep = (g >= n_eval) & ((g - n_eval) % process_count == process_index)
    positions.append(first[shard] + records[keep])
    ids.append(g[keep])
  return np.concatenate(positions), np.concatenate(ids)


def load_documents(prepared_dir: str, *, split: str = "train", eval_fraction: float = 0.01,
                   nsp: bool = True, process_index: int = 0, process_count: int = 1,
                   doc_piece_tokens: int = 8192, cache_dir: str | None = None) -> dict:
  """This host's documents of a split (see module doc). `cache_dir`: where the parts of a
  gs:// corpus that this host reads are copied to be memory-mapped (store.py)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count}).")
  summary = prepare.load_summary(prepared_dir)
  num_docs, num_shards = summary["documents"], summary["num_shards"]
  n_eval = eval_document_count(num_docs, eval_fraction, nsp, prepared_dir)
  positions, doc_ids = host_documents(summary["shard_documents"], split, n_eval,
                                      process_index, process_count)
  if not len(positions):
    raise TooFewDocumentsError(
        f"Host {process_index}/{process_count} has no {split} documents in {prepared_dir} "
        f"({num_docs} documents in {num_shards} shards): prepare it again with at least "
        f"one shard a host (--num_shards).")
  arrays = store.open_arrays(prepared_dir, summary, cache_dir, positions)
  doc_starts = arrays["document_starts"]
  corpus = {
      "tokens": arrays["tokens"], "sent_start": arrays["sentence_starts"],
      "doc_first": np.asarray(doc_starts[positions], np.int64),
      "doc_stop": np.asarray(doc_starts[positions + 1], np.int64),
      "doc_ids": doc_ids,
  }
  corpus["piece_first"], corpus["piece_stop"], corpus["piece_doc"] = instances.pieces(
      corpus["sent_start"], corpus["doc_first"], corpus["doc_stop"], doc_piece_tokens)
  return corpus
