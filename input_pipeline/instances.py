"""A host's documents -> NSP sentence pairs (numpy), following google-research/bert.

The documents of one host and split are described by a dict (`documents.load_documents`):
  tokens      [T] uint16 (uint32 if the vocabulary has > 65,536 entries), the corpus's
              tokens back to back (a memory map of the prepared corpus);
  sent_start  [S+1] int64, token offset of each sentence (sentence s = tokens[sent_start[s]:
              sent_start[s+1]]), also a memory map;
  doc_first, doc_stop  [D] int64, the host's documents as sentence ranges;
  doc_ids     [D] int64, the document's index in the prepared corpus (for tests, tracing);
  piece_first, piece_stop [U] int64 and piece_doc [U]: documents cut at sentence
              boundaries into pieces of about `doc_piece_tokens` tokens, the unit of
              shuffling (see below).
Memory: only the per-document and per-piece arrays (tens of bytes per document); tokens
and sentence offsets are paged in from the memory maps as blocks read them.

Instances are described as token ranges, never copied token by token in Python:
a_start/a_len and b_start/b_len index `tokens`; `assemble` builds the padded feature
arrays for a whole block at once.
"""
import random

import numpy as np

INSTANCE_KEYS = ("a_start", "a_len", "b_start", "b_len", "label", "target", "single")


def pieces(sent_start, doc_first: np.ndarray, doc_stop: np.ndarray, piece_tokens: int):
  """Cuts documents at sentence boundaries into pieces of about piece_tokens tokens.

  Documents are sentence ranges [doc_first[d], doc_stop[d]) of `sent_start` (in increasing
  order, not overlapping). Returns (piece_first [U], piece_stop [U], piece_doc [U]). A
  piece never spans two documents; a sentence starting beyond a multiple of piece_tokens
  (counted from its document's start) begins a new piece. piece_tokens <= 0 keeps
  documents whole. Cost: one binary search in `sent_start` per piece, so a memory-mapped
  `sent_start` is read only around the piece boundaries.
  """
  doc_first = np.asarray(doc_first, np.int64)
  doc_stop = np.asarray(doc_stop, np.int64)
  num_docs = len(doc_first)
  starts, docs = [doc_first], [np.arange(num_docs)]
  if piece_tokens > 0 and num_docs:
    begin = np.asarray(sent_start[doc_first], np.int64)
    # Sentences start below the document's last sentence start + 1; targets k*piece_tokens
    # (k >= 1) below it may begin a piece: the first sentence starting at or after one.
    last = np.asarray(sent_start[doc_stop - 1], np.int64) - begin
    count = last // piece_tokens
    doc = np.repeat(np.arange(num_docs), count)
    k = np.arange(len(doc)) - np.repeat(np.cumsum(count) - count, count) + 1
    sentence = np.searchsorted(sent_start, begin[doc] + k * piece_tokens)
    starts.append(sentence.astype(np.int64))
    docs.append(doc)
  first, doc = np.concatenate(starts), np.concatenate(docs)
  order = np.lexsort((first, doc))
  first, doc = first[order], doc[order]
  keep = np.ones(len(first), bool)
  keep[1:] = (first[1:] != first[:-1]) | (doc[1:] != doc[:-1])
  first, doc = first[keep], doc[keep]
  stop = np.append(first[1:], 0)
  last_of_doc = np.append(doc[1:] != doc[:-1], True)
  stop[last_of_doc] = doc_stop[doc[last_of_doc]]
  return first, stop, doc


def _target_length(rng: random.Random, max_num_tokens: int, short_seq_prob: float) -> int:
  # Drawn per instance. The original draws once per document, which for book-length
  # documents makes the share of short sequences a coin flip per book.
  if rng.random() < short_seq_prob:
    return rng.randint(2, max_num_tokens)
  return max_num_tokens


def make_instances(corpus: dict, piece_ids, rng: random.Random, *, max_seq_length: int,
                   short_seq_prob: float, nsp: bool) -> dict:
  """Sentence-pair instances (token ranges) from some pieces, before truncation.

  google-research/bert create_instances_from_document, per piece: gather sentences into a
  chunk until it reaches the target length; A = the first randint(1, len-1) sentences;
  B = the rest (IsNext, label 0) or, with probability 1/2 or when the chunk has a single
  sentence, text from a random sentence of a random *other* document, as long as needed
  (NotNext, label 1), the chunk's unused sentences going back to the stream. Without NSP
  the whole chunk is segment A (target max_seq_length - 2).

  As in the original, single-sentence chunks (a document's last sentence, or one longer
  than the target) are always NotNext, so slightly more than half of the pairs are
  NotNext (~53% on Gutenberg books at L=128, ~55% on the built-in corpus's short
  documents). Returns the arrays of INSTANCE_KEYS ("target": the drawn target length,
  "single": the chunk had one sentence).
  """
  sent_start = corpus["sent_start"]
  piece_first, piece_stop = corpus["piece_first"], corpus["piece_stop"]
  piece_doc = corpus["piece_doc"]
  num_docs = len(corpus["doc_first"])
  if nsp and num_docs < 2:
    raise ValueError("Next-sentence prediction needs at least 2 documents in the split.")
  max_num_tokens = max_seq_length - (3 if nsp else 2)
  out = {k: [] for k in INSTANCE_KEYS}
  for piece in piece_ids:
    s0, s1 = int(piece_first[piece]), int(piece_stop[piece])
    starts = sent_start[s0:s1 + 1].tolist()
    doc = int(piece_doc[piece])
    n = s1 - s0
    target = _target_length(rng, max_num_tokens, short_seq_prob)
    chunk_start, i = 0, 0
    while i < n:
      if i == n - 1 or starts[i + 1] - starts[chunk_start] >= target:
        count = i - chunk_start + 1
        a_end = chunk_start + (rng.randint(1, count - 1) if count >= 2 and nsp else count)
        a_start, a_stop = starts[chunk_start], starts[a_end]
        label = 0
        if not nsp:
          b_start = b_stop = 0
        elif count == 1 or rng.random() < 0.5:
          label = 1
          b_start, b_stop = _random_next(corpus, doc, target - (a_stop - a_start), rng,
                                         num_docs)
          i -= i + 1 - a_end  # Unused sentences go back to the stream.
        else:
          b_start, b_stop = a_stop, starts[i + 1]
        out["a_start"].append(a_start)
        out["a_len"].append(a_stop - a_start)
        out["b_start"].append(b_start)
        out["b_len"].append(b_stop - b_start)
        out["label"].append(label)
        out["target"].append(target)
        out["single"].append(count == 1)
        chunk_start = i + 1
        target = _target_length(rng, max_num_tokens, short_seq_prob)
      i += 1
  return {k: np.array(v, np.int64) for k, v in out.items()}


def _random_next(corpus: dict, doc: int, target_b: int, rng: random.Random,
                 num_docs: int) -> tuple[int, int]:
  """Token range of a NotNext segment B: whole sentences of another document, from a
  random one until target_b tokens (at least one sentence, at most the document's end)."""
  other = rng.randrange(num_docs - 1)
  other += other >= doc  # Uniform over the other documents: never the same one.
  d0, d1 = int(corpus["doc_first"][other]), int(corpus["doc_stop"][other])
  first = rng.randint(d0, d1 - 1)
  sent_start = corpus["sent_start"]
  begin = int(sent_start[first])
  # Smallest end sentence e > first with tokens [begin, sent_start[e]) >= target_b.
  stop = first + 1 + int(np.searchsorted(sent_start[first + 1:d1 + 1], begin + target_b))
  return begin, int(sent_start[min(stop, d1)])


def truncated_lengths(a_len: np.ndarray, b_len: np.ndarray, max_num_tokens: int):
  """Final (a_len, b_len) of BERT's truncate_seq_pair, in closed form.

  The original removes one token at a time from the longer side (B on ties) until the
  pair fits: the longer side first shrinks to the shorter one's length, then they take
  turns, B first. Which end each token leaves from is drawn separately (truncate()).
  """
  excess = np.maximum(a_len + b_len - max_num_tokens, 0)
  gap = np.abs(a_len - b_len)
  first = np.minimum(excess, gap)       # Taken from the longer side alone.
  rest = excess - first                 # Then alternately, B first.
  a_cut = np.where(a_len > b_len, first, 0) + rest // 2
  b_cut = np.where(a_len > b_len, 0, first) + (rest + 1) // 2
  return a_len - a_cut, b_len - b_cut


def truncate(inst: dict, np_rng: np.random.Generator, max_num_tokens: int) -> dict:
  """Truncates pairs to max_num_tokens, each removed token from a random end.

  The number of tokens removed from a side's front is Binomial(removed, 1/2), exactly the
  distribution of the original's token-by-token coin flips.
  """
  a_len, b_len = truncated_lengths(inst["a_len"], inst["b_len"], max_num_tokens)
  a_front = np_rng.binomial(inst["a_len"] - a_len, 0.5)
  b_front = np_rng.binomial(inst["b_len"] - b_len, 0.5)
  return dict(inst, a_start=inst["a_start"] + a_front, a_len=a_len,
              b_start=inst["b_start"] + b_front, b_len=b_len)


def assemble(tokens: np.ndarray, inst: dict, *, max_seq_length: int, cls_id: int,
             sep_id: int, pad_id: int) -> dict:
  """Token ranges -> padded [N, L] int32 features: [CLS] A [SEP] (B [SEP]), then [PAD].

  Pairs with b_len == 0 are single segments. Returns input_ids, input_mask, segment_ids,
  next_sentence_labels; masking comes later (masking.py).
  """
  pos = np.arange(max_seq_length)[None, :]
  a_len, b_len = inst["a_len"][:, None], inst["b_len"][:, None]
  has_b = b_len > 0
  in_a = (pos >= 1) & (pos <= a_len)
  b_first = a_len + 2
  in_b = (pos >= b_first) & (pos < b_first + b_len)
  index = np.where(in_a, inst["a_start"][:, None] + pos - 1,
                   np.where(in_b, inst["b_start"][:, None] + pos - b_first, 0))
  ids = np.where(in_a | in_b, tokens[index], pad_id).astype(np.int32)
  ids[:, 0] = cls_id
  length = np.where(has_b, a_len + b_len + 3, a_len + 2)
  ids[(pos == a_len + 1) | (has_b & (pos == length - 1))] = sep_id
  return {
      "input_ids": ids,
      "input_mask": (pos < length).astype(np.int32),
      "segment_ids": (has_b & (pos >= b_first) & (pos < length)).astype(np.int32),
      "next_sentence_labels": inst["label"].astype(np.int32),
  }
