"""The pre-training pipeline: shapes, pairing, masking statistics, determinism, sharding."""
import json
import os
import pathlib
import random
import time

import numpy as np
import pytest

from input_pipeline import documents
from common import errors
from input_pipeline import data_config
from input_pipeline import instances as inst_lib
from input_pipeline import masking
from input_pipeline import prepare
from input_pipeline import pretrain
from input_pipeline import testing
from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
GUTENBERG = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "gutenberg"


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
  return testing.make_tagged_corpus(str(tmp_path_factory.mktemp("tagged")), num_docs=12)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
  """A real-text prepared corpus: 24 Gutenberg books when present, else the built-in one."""
  root = tmp_path_factory.mktemp("real")
  books = sorted(GUTENBERG.glob("pg*.txt"))[:24]
  spec = ",".join(map(str, books)) if books else "default"
  vocab = vocab_lib.train_vocab(spec, str(root / "vocab"), vocab_size=4000, max_chars=3_000_000)
  prepare.prepare_corpus(spec, vocab, str(root / "prepared"), num_shards=2, num_workers=1,
                         progress=False)
  return {"vocab": vocab, "prepared": str(root / "prepared"), "source": spec[:40]}


def _cfg(corpus: dict, **overrides):
  cfg = data_config.default_data_config()
  cfg.prepared_dir = corpus["prepared"]
  cfg.vocab_path = corpus["vocab"]
  cfg.update(overrides)
  return cfg


def _batches(cfg, n, batch_size=64, **kwargs):
  it = pretrain.PretrainIterator(cfg, batch_size=batch_size, seed=kwargs.pop("seed", 0),
                                 **kwargs)
  return [next(it) for _ in range(n)]


def _stack(batches):
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _unmasked(ex):
  """input_ids with the chosen positions restored to their original tokens."""
  ids = ex["input_ids"].copy()
  real = ex["masked_lm_weights"] > 0
  rows = np.broadcast_to(np.arange(len(ids))[:, None], real.shape)[real]
  ids[rows, ex["masked_lm_positions"][real]] = ex["masked_lm_ids"][real]
  return ids


# ---------------------------------------------------------------- shapes and layout


def test_feature_shapes_and_dtypes(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10)
  expected = {"input_ids": [64], "input_mask": [64], "segment_ids": [64],
              "masked_lm_positions": [10], "masked_lm_ids": [10], "masked_lm_weights": [10],
              "next_sentence_labels": []}
  assert set(pretrain.features(cfg)) == set(pretrain.FEATURES) == set(expected)
  # Per example: the stream's examples (one block, leading dim = its examples).
  examples = pretrain.make_stream(cfg, seed=0).rows(0, 0)
  n = len(examples["input_ids"])
  assert set(examples) == set(expected) and n > 1
  for k, shape in expected.items():
    assert examples[k].shape == (n, *shape), k
    assert examples[k].dtype == (np.float32 if k == "masked_lm_weights" else np.int32), k
  # Batched: the iterator's batches, of any batch size.
  for batch_size in (8, 5):
    batch = next(iter(_batches(cfg, 1, batch_size=batch_size)))
    assert set(batch) == set(expected)
    for k, shape in expected.items():
      assert batch[k].shape == (batch_size, *shape), k
      assert batch[k].dtype == (np.float32 if k == "masked_lm_weights" else np.int32), k


def test_sequence_layout(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10)
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ex = _stack(_batches(cfg, 4, batch_size=32))
  ids = _unmasked(ex)
  for row, seg, mask in zip(ids, ex["segment_ids"], ex["input_mask"]):
    n = mask.sum()
    assert (mask[:n] == 1).all() and (mask[n:] == 0).all() and (row[n:] == tok.pad_id).all()
    assert row[0] == tok.cls_id and row[n - 1] == tok.sep_id
    seps = np.flatnonzero(row == tok.sep_id)
    assert len(seps) == 2, seps
    a_end = seps[0]
    assert (seg[:a_end + 1] == 0).all() and (seg[a_end + 1:n] == 1).all() and (seg[n:] == 0).all()
    assert a_end >= 2 and n - a_end >= 3  # Both segments hold at least one token.


def test_no_nsp_single_segments(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, nsp=False)
  ex = _stack(_batches(cfg, 3, batch_size=32))
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ids = _unmasked(ex)
  assert (ex["next_sentence_labels"] == 0).all() and (ex["segment_ids"] == 0).all()
  assert ((ids == tok.sep_id).sum(1) == 1).all()
  lengths = ex["input_mask"].sum(1)
  assert lengths.max() == 64  # Single segments fill up to L - 2 tokens.
  # One document per example.
  docs = testing.token_document(ids, tagged["num_docs"], tagged["words_per_doc"])
  for row in docs:
    assert len(set(row[row >= 0])) == 1


# ---------------------------------------------------------------- pairing (numpy)


def _original_truncate(la, lb, max_num_tokens):
  a, b = list(range(la)), list(range(lb))
  while len(a) + len(b) > max_num_tokens:
    (a if len(a) > len(b) else b).pop()
  return len(a), len(b)


def test_truncated_lengths_match_original_loop():
  la, lb = np.meshgrid(np.arange(1, 70), np.arange(1, 70))
  la, lb = la.ravel(), lb.ravel()
  got_a, got_b = inst_lib.truncated_lengths(la, lb, 45)
  want = np.array([_original_truncate(a, b, 45) for a, b in zip(la, lb)])
  np.testing.assert_array_equal(got_a, want[:, 0])
  np.testing.assert_array_equal(got_b, want[:, 1])


def test_pieces_cut_at_sentences_within_documents():
  sent_len = np.array([5, 5, 5, 5, 5, 3, 9, 9, 4, 30, 2, 2])
  sent_start = np.concatenate([[0], np.cumsum(sent_len)])
  doc_first, doc_stop = np.array([0, 5]), np.array([5, 8])
  first, stop, doc = inst_lib.pieces(sent_start, doc_first, doc_stop, 10)
  np.testing.assert_array_equal(first, [0, 2, 4, 5, 7])
  np.testing.assert_array_equal(stop, [2, 4, 5, 7, 8])
  np.testing.assert_array_equal(doc, [0, 0, 0, 1, 1])
  whole = inst_lib.pieces(sent_start, doc_first, doc_stop, 0)
  np.testing.assert_array_equal(whole, [[0, 5], [5, 8], [0, 1]])
  # A host's documents need not be adjacent (doc [8, 10) belongs to another host).
  first, stop, doc = inst_lib.pieces(sent_start, np.array([0, 10]), np.array([5, 12]), 10)
  np.testing.assert_array_equal(first, [0, 2, 4, 10])
  np.testing.assert_array_equal(stop, [2, 4, 5, 12])
  np.testing.assert_array_equal(doc, [0, 0, 0, 1])
  # Sentences at offsets 0, 4, 34, 36: the 30-token one spans 10, 20 and 30, and the
  # next sentence begins the one piece after it (no empty pieces).
  first, stop, doc = inst_lib.pieces(sent_start, np.array([8]), np.array([12]), 10)
  np.testing.assert_array_equal(first, [8, 10])
  np.testing.assert_array_equal(stop, [10, 12])


def test_instances_follow_bert_algorithm(tagged):
  corpus = documents.load_documents(tagged["prepared"], eval_fraction=0.0, doc_piece_tokens=0)
  tokens, sent_start = corpus["tokens"], corpus["sent_start"]
  token_doc = np.full(len(tokens), -1)  # The host document of each token of the corpus.
  for d, (first, stop) in enumerate(zip(corpus["doc_first"], corpus["doc_stop"])):
    token_doc[sent_start[first]:sent_start[stop]] = d
  inst = inst_lib.make_instances(corpus, np.arange(len(corpus["piece_doc"])), random.Random(0),
                                 max_seq_length=64, short_seq_prob=0.1, nsp=True)
  starts = set(sent_start.tolist())
  for a0, al, b0, bl, label in zip(*(inst[k] for k in ("a_start", "a_len", "b_start", "b_len",
                                                          "label"))):
    assert al >= 1 and bl >= 1
    assert a0 in starts and a0 + al in starts and b0 in starts  # Whole sentences.
    a_doc, b_doc = token_doc[a0], token_doc[b0]
    assert token_doc[a0 + al - 1] == a_doc and token_doc[b0 + bl - 1] == b_doc
    if label == 0:
      assert b0 == a0 + al  # IsNext: B is the text that follows A.
    else:
      assert b_doc != a_doc  # NotNext: another document.
  # Every sentence of the corpus starts a segment A, or is part of one (no text lost).
  covered = np.zeros(len(tokens), bool)
  for a0, al, b0, bl, label in zip(*(inst[k] for k in ("a_start", "a_len", "b_start", "b_len",
                                                          "label"))):
    covered[a0:a0 + al] = True
    if label == 0:
      covered[b0:b0 + bl] = True
  assert covered[token_doc >= 0].all() and not covered[token_doc < 0].any()
  truncated = inst_lib.truncate(inst, np.random.default_rng(0), 61)
  assert (truncated["a_len"] + truncated["b_len"] <= 61).all()
  assert (truncated["a_start"] >= inst["a_start"]).all()
  assert (truncated["a_start"] + truncated["a_len"] <= inst["a_start"] + inst["a_len"]).all()


def test_assemble_layout():
  tokens = np.arange(100, 200, dtype=np.uint16)
  inst = {"a_start": np.array([0, 10]), "a_len": np.array([3, 4]),
          "b_start": np.array([50, 0]), "b_len": np.array([2, 0]), "label": np.array([1, 0])}
  out = inst_lib.assemble(tokens, inst, max_seq_length=10, cls_id=2, sep_id=3, pad_id=0)
  np.testing.assert_array_equal(out["input_ids"], [[2, 100, 101, 102, 3, 150, 151, 3, 0, 0],
                                                   [2, 110, 111, 112, 113, 3, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out["segment_ids"], [[0, 0, 0, 0, 0, 1, 1, 1, 0, 0], [0] * 10])
  np.testing.assert_array_equal(out["input_mask"].sum(1), [8, 6])
  np.testing.assert_array_equal(out["next_sentence_labels"], [1, 0])


# ---------------------------------------------------------------- masking


def _mask_fn(tok, **kw):
  args = dict(is_special=tok.is_special, is_continuation=tok.is_continuation,
              mask_id=tok.mask_id, max_predictions_per_seq=8, masked_lm_prob=0.15,
              whole_word_masking=False)
  args.update(kw)
  return masking.make_mask_fn(**args)


def test_mask_fn_is_numpy_seeded_and_per_row(tagged):
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ids = np.array([tok.cls_id] + list(range(5, 40)) + [tok.sep_id] + [0] * 12, np.int32)
  block = {"input_ids": np.stack([np.roll(ids, 0)] * 6), "mask_seed": np.array([7, 1])}
  for wwm in (False, True):
    fn = _mask_fn(tok, whole_word_masking=wwm)
    out = fn(block)
    assert set(out) == {"input_ids", "masked_lm_positions", "masked_lm_ids",
                        "masked_lm_weights"}
    assert all(isinstance(v, np.ndarray) for v in out.values())
    assert out["masked_lm_positions"].shape == (6, 8)
    assert out["input_ids"].dtype == np.int32 and out["masked_lm_positions"].dtype == np.int32
    assert out["masked_lm_weights"].dtype == np.float32
    # Rows of a block get different masks; the same seed, the same masks; another seed,
    # other masks; the input is not modified.
    assert len({tuple(r) for r in out["masked_lm_positions"]}) > 1
    again = fn({k: v.copy() for k, v in block.items()})
    for k in out:
      np.testing.assert_array_equal(out[k], again[k])
    other = fn(dict(block, mask_seed=np.array([7, 2])))
    assert not np.array_equal(other["masked_lm_positions"], out["masked_lm_positions"])
    assert (block["input_ids"] == ids).all()
    assert (out["masked_lm_weights"].sum(1) >= 5).all()  # floor(35 * 0.15 + u) in {5, 6}
    assert (out["masked_lm_weights"].sum(1) <= 6).all()
    # One example ([L]) works too, and is the first row of the same block of one.
    one = {"input_ids": ids, "mask_seed": np.array([7, 2])}
    single = fn(one)
    assert single["masked_lm_positions"].shape == (8,)
    np.testing.assert_array_equal(single["input_ids"],
                                  fn(dict(one, input_ids=ids[None]))["input_ids"][0])


def test_mask_fn_shorter_rows_than_predictions(tagged):
  """L < P: every candidate can be chosen, the rest of the P slots is padding."""
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ids = np.array([[tok.cls_id, 5, 6, 7, tok.sep_id, 0]], np.int32)
  out = _mask_fn(tok, max_predictions_per_seq=10, masked_lm_prob=1.0)(
      {"input_ids": ids, "mask_seed": np.array([0, 3])})
  np.testing.assert_array_equal(out["masked_lm_positions"][0], [1, 2, 3] + [0] * 7)
  np.testing.assert_array_equal(out["masked_lm_ids"][0], [5, 6, 7] + [0] * 7)
  np.testing.assert_array_equal(out["masked_lm_weights"][0], [1, 1, 1] + [0] * 7)


def test_a_state_saved_by_tensorflow_masking_resumes_with_a_notice(tagged, caplog):
  """Saved states carry the masking version; one from before (TF masks) resumes at the same
  examples, with one warning that its masks are drawn afresh."""
  cfg = _cfg(tagged)
  it = pretrain.PretrainIterator(cfg, batch_size=4, seed=0)
  next(it)
  state = it.get_state()
  assert state["masking"] == masking.VERSION
  old = {k: v for k, v in state.items() if k != "masking"}
  resumed = pretrain.PretrainIterator(cfg, batch_size=4, seed=0)
  with caplog.at_level("WARNING"):
    resumed.set_state(old)
  assert any("masking version 1" in r.getMessage() for r in caplog.records)
  after = next(resumed)
  expect = next(it)
  # The same examples (unmasked ids), masks drawn by this version: identical here.
  np.testing.assert_array_equal(after["masked_lm_positions"], expect["masked_lm_positions"])
  it.close(), resumed.close()


def test_masking_statistics_real_corpus(real):
  """Rate = 15% of maskable tokens (P not binding), 80/10/10, specials never chosen."""
  cfg = _cfg(real, max_seq_length=128, max_predictions_per_seq=128)
  tok = tokenizer_lib.Tokenizer.from_path(real["vocab"])
  ex = _stack(_batches(cfg, 40, batch_size=100))
  original = _unmasked(ex)
  candidates = (~tok.is_special[original]).sum()
  real_w = ex["masked_lm_weights"] > 0
  chosen = real_w.sum()
  assert abs(chosen / candidates - 0.15) < 0.002, chosen / candidates
  rows = np.repeat(np.arange(len(original))[:, None], real_w.shape[1], 1)[real_w]
  pos = ex["masked_lm_positions"][real_w]
  now = ex["input_ids"][rows, pos]
  label = ex["masked_lm_ids"][real_w]
  frac_mask = (now == tok.mask_id).mean()
  frac_same = (now == label).mean()
  frac_random = 1 - frac_mask - frac_same
  assert abs(frac_mask - 0.8) < 0.01 and abs(frac_same - 0.1) < 0.01, (frac_mask, frac_same)
  assert abs(frac_random - 0.1) < 0.01
  assert not tok.is_special[label].any()          # Never [CLS] [SEP] [PAD] ...
  assert not tok.is_special[now[now != tok.mask_id]].any()  # Random tokens are real words.
  assert (ex["input_mask"][rows, pos] == 1).all()  # ... nor padding.
  assert (pos > 0).all()
  # Unchosen positions are untouched; chosen positions ascending and distinct.
  changed = ex["input_ids"] != original
  changed[rows, pos] = False
  assert not changed.any()
  p = np.where(real_w, ex["masked_lm_positions"], 10**6)
  assert (np.diff(p, axis=1)[real_w[:, 1:]] > 0).all()
  assert (ex["masked_lm_positions"][~real_w] == 0).all() and (ex["masked_lm_ids"][~real_w] == 0).all()


def test_max_predictions_respected(real):
  cfg = _cfg(real, max_seq_length=128, max_predictions_per_seq=5)
  ex = _stack(_batches(cfg, 4, batch_size=64))
  counts = ex["masked_lm_weights"].sum(1)
  assert counts.max() == 5 and (counts <= 5).all()
  assert ex["masked_lm_weights"].shape == (256, 5)


def test_whole_word_masking(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=64, whole_word_masking=True)
  tok = tokenizer_lib.Tokenizer.from_path(tagged["vocab"])
  ex = _stack(_batches(cfg, 6, batch_size=64))
  original = _unmasked(ex)
  chosen = np.zeros(original.shape, bool)
  real_w = ex["masked_lm_weights"] > 0
  rows = np.repeat(np.arange(len(original))[:, None], real_w.shape[1], 1)[real_w]
  chosen[rows, ex["masked_lm_positions"][real_w]] = True
  cont = tok.is_continuation[original]
  assert cont.any() and chosen.any()
  # A continuation piece is chosen exactly when the piece before it is (unless truncation
  # cut its word's start, leaving it first in its segment: then it is a word of its own).
  pairs = cont[:, 1:] & ~tok.is_special[original[:, :-1]]
  np.testing.assert_array_equal(chosen[:, 1:][pairs], chosen[:, :-1][pairs])
  candidates = (~tok.is_special[original]).sum()
  assert 0.12 < real_w.sum() / candidates <= 0.15


# ---------------------------------------------------------------- NSP


def test_nsp_balance_and_short_sequences(real):
  corpus = documents.load_documents(real["prepared"])
  inst = inst_lib.make_instances(corpus, np.arange(len(corpus["piece_doc"])), random.Random(1),
                                 max_seq_length=128, short_seq_prob=0.1, nsp=True)
  # The coin is fair where it is flipped; single-sentence chunks are NotNext (original).
  flipped = ~inst["single"].astype(bool)
  assert abs(inst["label"][flipped].mean() - 0.5) < 0.02
  assert (inst["label"][~flipped] == 1).all()
  short = (inst["target"] < 125).mean()
  assert abs(short - 0.1) < 0.02, short
  cfg = _cfg(real, max_seq_length=128, max_predictions_per_seq=20)
  ex = _stack(_batches(cfg, 30, batch_size=100))
  assert 0.45 < ex["next_sentence_labels"].mean() < 0.6
  assert (ex["input_mask"].sum(1) < 64).mean() < 0.2  # Mostly full sequences.


def test_not_next_segment_from_another_document(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10)
  ex = _stack(_batches(cfg, 8, batch_size=64))
  docs = testing.token_document(_unmasked(ex), tagged["num_docs"], tagged["words_per_doc"])
  labels = ex["next_sentence_labels"]
  assert 0.35 < labels.mean() < 0.65
  for row, seg, label in zip(docs, ex["segment_ids"], labels):
    a = set(row[(seg == 0) & (row >= 0)])
    b = set(row[(seg == 1) & (row >= 0)])
    assert len(a) == 1 and len(b) == 1
    assert (a == b) == (label == 0)


# ---------------------------------------------------------------- determinism, restarts


def _equal(batches_a, batches_b):
  return all(np.array_equal(x[k], y[k]) for x, y in zip(batches_a, batches_b) for k in x)


def test_deterministic_and_seeded(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, shuffle_block_docs=3,
             doc_piece_tokens=200)
  assert _equal(_batches(cfg, 4, batch_size=16), _batches(cfg, 4, batch_size=16))
  assert not _equal(_batches(cfg, 2, batch_size=16), _batches(cfg, 2, batch_size=16, seed=1))
  # Batches cut the stream's examples, block after block, into consecutive runs: batches
  # span block (and, with 140 examples, epoch) ends, and the batch size changes no example.
  stream = pretrain.make_stream(cfg, seed=0)
  blocks = [stream.rows(e, b) for e in range(2) for b in range(stream.blocks_per_epoch)]
  epoch_size = sum(len(b["input_ids"]) for b in blocks[:stream.blocks_per_epoch])
  assert any(len(b["input_ids"]) % 16 for b in blocks) and epoch_size < 140
  examples = _stack(blocks)
  for batch_size, n in ((16, 4), (7, 20)):
    batches = _batches(cfg, n, batch_size=batch_size)
    assert all(len(b["input_ids"]) == batch_size for b in batches)
    got = _stack(batches)
    assert set(got) == set(pretrain.FEATURES)
    for k in got:
      np.testing.assert_array_equal(got[k], examples[k][:batch_size * n], err_msg=k)


def test_restart_resumes_exact_stream(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, shuffle_block_docs=3,
             doc_piece_tokens=200)
  it = pretrain.PretrainIterator(cfg, batch_size=16, seed=3)
  reference = [next(it) for _ in range(60)]  # Several epochs of the tiny corpus.
  assert it.get_state()["epoch"] >= 2
  for k in (1, 7, 33):
    first = pretrain.PretrainIterator(cfg, batch_size=16, seed=3)
    for _ in range(k):
      next(first)
    state = json.loads(json.dumps(first.get_state()))
    resumed = pretrain.PretrainIterator(cfg, batch_size=16, seed=3)
    resumed.set_state(state)
    assert _equal([next(resumed) for _ in range(5)], reference[k:k + 5]), k
  with pytest.raises(ValueError, match="another setup"):
    pretrain.PretrainIterator(cfg, batch_size=16, seed=4).set_state(state)



def test_a_state_at_a_block_end_resumes_in_either_form(tagged):
  # Checkpoints saved before the stream's rows went through one cursor hold a batch that
  # ended a block as (block, offset=its size); now it is (next block, 0): both resume the same.
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, shuffle_block_docs=3,
             doc_piece_tokens=200)
  stream = pretrain.make_stream(cfg, seed=0)
  size = len(stream.rows(0, 0)["input_ids"])
  assert stream.blocks_per_epoch > 2 and size < 20
  keys = pretrain.FEATURES
  old = stream.cursor({"epoch": 0, "block": 0, "offset": size})
  new = stream.cursor({"epoch": 0, "block": 1, "offset": 0})
  assert _equal([old.take(20, keys)], [new.take(20, keys)])
  assert old.state() == new.state()
  it = pretrain.PretrainIterator(cfg, batch_size=size, seed=0)
  next(it)  # exactly the first block
  assert {k: it.get_state()[k] for k in ("epoch", "block", "offset")} == {"epoch": 0, "block": 1, "offset": 0}

def test_set_state_far_ahead_is_fast(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, shuffle_block_docs=3,
             doc_piece_tokens=200)
  it = pretrain.PretrainIterator(cfg, batch_size=16, seed=0)
  far = dict(it.get_state(), epoch=10**6, block=1, offset=5)
  start = time.time()
  it.set_state(far)
  batch = next(it)
  assert time.time() - start < 10  # One block regenerated, no replay of 10^6 epochs.
  again = pretrain.PretrainIterator(cfg, batch_size=16, seed=0)
  again.set_state(far)
  assert _equal([batch], [next(again)])
  assert it.get_state()["epoch"] >= 10**6


# ---------------------------------------------------------------- hosts and splits


def test_hosts_see_disjoint_documents(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, nsp=False)
  seen, loaded = [], []
  for host in range(2):
    corpus = documents.load_documents(tagged["prepared"], process_index=host, process_count=2,
                                     nsp=False)
    loaded.append(set(corpus["doc_ids"].tolist()))
    ex = _stack(_batches(cfg, 4, batch_size=32, process_index=host, process_count=2))
    docs = testing.token_document(_unmasked(ex), tagged["num_docs"], tagged["words_per_doc"])
    seen.append(set(docs[docs >= 0].tolist()))
  assert not loaded[0] & loaded[1] and not seen[0] & seen[1]
  n_eval = documents.eval_document_count(tagged["num_docs"], 0.01, nsp=False)
  assert loaded[0] | loaded[1] == set(range(n_eval, tagged["num_docs"]))


def test_fewer_files_than_hosts(tmp_path):
  corpus = testing.make_tagged_corpus(str(tmp_path), num_docs=9, num_shards=1)
  ids = [set(documents.load_documents(corpus["prepared"], process_index=h, process_count=3)
             ["doc_ids"].tolist()) for h in range(3)]
  assert sum(map(len, ids)) == 9 - 2 and not (ids[0] & ids[1] or ids[1] & ids[2] or ids[0] & ids[2])


def test_eval_split_is_held_out(tagged):
  cfg = _cfg(tagged, max_seq_length=64, max_predictions_per_seq=10, eval_fraction=0.2)
  train = documents.load_documents(tagged["prepared"], eval_fraction=0.2)
  held = documents.load_documents(tagged["prepared"], eval_fraction=0.2, split="eval")
  assert set(held["doc_ids"].tolist()) == {0, 1}  # round(0.2 * 12) = 2 documents.
  assert not set(train["doc_ids"].tolist()) & {0, 1}
  ex = _stack(_batches(cfg, 2, batch_size=16, split="eval"))
  docs = testing.token_document(_unmasked(ex), tagged["num_docs"], tagged["words_per_doc"])
  assert set(docs[docs >= 0].tolist()) <= {0, 1}
  assert _equal(_batches(cfg, 2, batch_size=16, split="eval"),
                _batches(cfg, 2, batch_size=16, split="eval"))


def test_vocab_mismatch_refused(tagged, tmp_path):
  other = testing.write_vocab(str(tmp_path / "vocab.txt"), ["a", "b"])
  cfg = _cfg(tagged)
  cfg.vocab_path = other
  with pytest.raises(ValueError, match="Vocabulary mismatch"):
    pretrain.PretrainIterator(cfg, batch_size=4, seed=0)
  cfg.prepared_dir = str(tmp_path / "nothing")
  with pytest.raises(FileNotFoundError, match="input_pipeline.prepare"):
    pretrain.PretrainIterator(cfg, batch_size=4, seed=0)


def _table8_inputs():
  vocab = 1000
  is_special = np.zeros(vocab, bool)
  is_special[:5] = True
  is_continuation = np.zeros(vocab, bool)
  is_continuation[500:] = True
  ids = np.random.default_rng(0).integers(5, vocab, (64, 128)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  return is_special, is_continuation, ids


def test_default_mask_ratios_give_todays_masks():
  """data.mask_ratios' default (0.8, 0.1, 0.1) draws exactly the masks of the code before it
  (the digest of its outputs on a fixed input, recorded before the field existed)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  is_special, is_continuation, ids = _table8_inputs()
  digest = hashlib.sha256()
  for wwm in (False, True):
    fn = masking.make_mask_fn(is_special=is_special, is_continuation=is_continuation, mask_id=4,
                              max_predictions_per_seq=20, masked_lm_prob=0.15,
                              whole_word_masking=wwm)
    out = fn({"input_ids": ids, "mask_seed": np.array([7, 11], np.int64)})
    for k in sorted(out):
      digest.update(np.ascontiguousarray(out[k]).tobytes())
  assert digest.hexdigest() == "f46bb6a0b9935da3ba06864031aa7a21c2d10f7dd17639b36a8aec78f0afa10c"
  assert tuple(data_config.default_data_config().mask_ratios) == (0.8, 0.1, 0.1)


@pytest.mark.parametrize("ratios", [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2),
                                    (0.8, 0.2, 0.0), (0.0, 0.2, 0.8), (0.0, 0.0, 1.0)])
def test_mask_ratios_of_every_table_8_row(ratios):
  """BERT's Table 8 rows ([MASK], same, random): each share within 1% over 100k+ masked
  tokens. A random replacement equal to the original token counts as "same" here, as the
  paper's does: it is one draw among ~1,000 non-special tokens."""
  is_special, is_continuation, ids = _table8_inputs()
  fn = masking.make_mask_fn(is_special=is_special, is_continuation=is_continuation, mask_id=4,
                            max_predictions_per_seq=20, masked_lm_prob=0.15,
                            whole_word_masking=False, mask_ratios=ratios)
  counts = np.zeros(3)
  for seed in range(90):
    out = fn({"input_ids": ids, "mask_seed": np.array([seed, 1], np.int64)})
    w = out["masked_lm_weights"] > 0
    shown = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], axis=1)[w]
    labels = out["masked_lm_ids"][w]
    counts += [(shown == 4).sum(), ((shown == labels)).sum(),
               ((shown != 4) & (shown != labels)).sum()]
  assert counts.sum() > 100_000
  np.testing.assert_allclose(counts / counts.sum(), ratios, atol=0.01)


@pytest.mark.parametrize("ratios", [(0.8, 0.1), (0.8, 0.3, 0.1), (1.1, 0.0, -0.1)])
def test_bad_mask_ratios_name_the_field(ratios):
  cfg = data_config.default_data_config()
  cfg.mask_ratios = ratios
  with pytest.raises(errors.ConfigError, match=r"^--config.data.mask_ratios=.*three shares "
                     r"\(\[MASK\], same, random\), each in \[0, 1\], that sum to 1"):
    data_config.check(cfg)
