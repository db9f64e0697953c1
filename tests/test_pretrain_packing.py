"""data.packing in the pre-training pipeline and the train step: packed rows hold exactly
the examples of the unpacked stream, resume exactly, and score the same losses."""
import functools
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from bert_jax import objectives
from bert_jax import trainer
from input_pipeline import data_config
from input_pipeline import pretrain
from input_pipeline import testing
from tests import test_train_utils as tu

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
L, P, E = 64, 10, 4


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
  # Short documents (few sentences): many examples far shorter than L, worth packing.
  return testing.make_tagged_corpus(str(tmp_path_factory.mktemp("tagged")), num_docs=30,
                                    sentences_per_doc=(1, 4), sentence_words=(3, 12))


def _cfg(corpus, packing=True, **overrides):
  cfg = data_config.default_data_config()
  cfg.prepared_dir, cfg.vocab_path = corpus["prepared"], corpus["vocab"]
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.max_examples_per_row = L, P, E
  cfg.shuffle_block_docs, cfg.packing = 8, packing
  cfg.update(overrides)
  return cfg


def _examples_of_rows(rows):
  """Each filled slot of packed rows as an unpacked example (tokens, masks, label)."""
  out = []
  for r in range(len(rows["input_ids"])):
    for e in np.nonzero(rows["example_weights"][r] > 0)[0]:
      at = rows["packed_example_ids"][r] == e + 1
      cols = np.nonzero(at)[0]
      assert cols[0] == rows["cls_positions"][r, e]
      np.testing.assert_array_equal(rows["position_ids"][r, at], np.arange(at.sum()))
      in_ex = ((rows["masked_lm_positions"][r] >= cols[0]) & (rows["masked_lm_positions"][r] <= cols[-1])
               & (rows["masked_lm_weights"][r] > 0))
      out.append((tuple(rows["input_ids"][r, at]), tuple(rows["segment_ids"][r, at]),
                  tuple(rows["masked_lm_positions"][r, in_ex] - cols[0]),
                  tuple(rows["masked_lm_ids"][r, in_ex]), int(rows["next_sentence_labels"][r, e])))
  return out


def _examples(ex):
  out = []
  for i in range(len(ex["input_ids"])):
    n, k = int(ex["input_mask"][i].sum()), ex["masked_lm_weights"][i] > 0
    out.append((tuple(ex["input_ids"][i, :n]), tuple(ex["segment_ids"][i, :n]),
                tuple(ex["masked_lm_positions"][i, k]), tuple(ex["masked_lm_ids"][i, k]),
                int(ex["next_sentence_labels"][i])))
  return out


def test_packed_block_holds_exactly_the_unpacked_examples(tagged):
  stream = pretrain.make_stream(_cfg(tagged), seed=0)
  examples, rows = stream.masked_block(0, 1), stream.rows(0, 1)
  assert sorted(_examples_of_rows(rows)) == sorted(_examples(examples))  # the same examples
  assert len(rows["input_ids"]) < 0.7 * len(examples["input_ids"])  # really packed
  assert rows["input_mask"].mean() > 1.4 * examples["input_mask"].mean()
  assert rows["masked_lm_positions"].shape[1] == P + E


def test_packed_iterator_shapes_resume_and_stream_order(tagged):
  cfg = _cfg(tagged)
  it = pretrain.PretrainIterator(cfg, batch_size=8, seed=1)
  reference = [next(it) for _ in range(12)]
  b = reference[0]
  assert set(b) == set(pretrain.PACKED_FEATURES) == set(pretrain.features(cfg))
  assert b["input_ids"].shape == (8, L) and b["cls_positions"].shape == (8, E)
  assert b["masked_lm_ids"].shape == (8, P + E) and b["example_weights"].dtype == np.float32
  shapes = {"masked_lm_positions": P + E, "masked_lm_ids": P + E, "masked_lm_weights": P + E,
            "next_sentence_labels": E, "cls_positions": E, "example_weights": E}
  for k in pretrain.PACKED_FEATURES:
    assert b[k].shape == (8, shapes.get(k, L)), k
    assert b[k].dtype == (np.float32 if k.endswith("weights") else np.int32), k
  resumed = pretrain.PretrainIterator(cfg, batch_size=8, seed=1)
  first = pretrain.PretrainIterator(cfg, batch_size=8, seed=1)
  for _ in range(5):
    next(first)
  resumed.set_state(json.loads(json.dumps(first.get_state())))
  for got, want in zip([next(resumed) for _ in range(7)], reference[5:]):
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # The batches are the stream's packed rows, block after block (across blocks and epochs).
  stream = pretrain.make_stream(cfg, seed=1)
  blocks, epoch = [], 0
  while sum(len(r["input_ids"]) for r in blocks) < 8 * len(reference):
    blocks += [stream.rows(epoch, blk) for blk in range(stream.blocks_per_epoch)]
    epoch += 1
  assert epoch > 1 and any(len(r["input_ids"]) % 8 for r in blocks)
  rows = {k: np.concatenate([r[k] for r in blocks]) for k in pretrain.PACKED_FEATURES}
  for i, want in enumerate(reference):
    for k in want:
      np.testing.assert_array_equal(rows[k][8 * i:8 * (i + 1)], want[k], err_msg=k)
  for i in (it, resumed, first):
    i.close()


def test_packed_step_scores_the_same_examples_as_unpacked(tagged):
  """eval_step sums (losses, accuracies, counts) over a block: packed == unpacked."""
  stream = pretrain.make_stream(_cfg(tagged), seed=0)
  examples, rows = stream.masked_block(0, 0), stream.rows(0, 0)
  cfg = model_lib.BertConfig(vocab_size=stream.tok.vocab_size, hidden_size=32, num_layers=2,
                             num_heads=4, intermediate_size=64, max_position_embeddings=L)
  model = model_lib.BertForPreTraining(cfg)
  ids = np.ones((1, L), np.int32)
  params = nn.unbox(model.init(jax.random.key(0), ids, ids, ids, np.zeros((1, P), np.int32)))["params"]
  step = jax.jit(functools.partial(trainer.eval_step, model=model,
                                   objective=objectives.pretraining()))
  plain = step(params, examples, jax.random.key(0))
  packed = step(params, rows, jax.random.key(0))
  assert float(packed["num_examples"]) == len(examples["input_ids"])
  for k in plain:
    np.testing.assert_allclose(float(packed[k]), float(plain[k]), rtol=2e-5, err_msg=k)


def test_packing_with_original_tfrecords_or_synthetic_data_is_refused(tagged):
  with pytest.raises(ValueError, match="packing works on prepared corpora"):
    pretrain.make_stream(_cfg(tagged, tfrecord_pattern="/nonexistent/*.tfrecord"), seed=0)
  from input_pipeline import pretrain as pretrain_data
  config = tu.tiny_config(data__packing=True)
  with pytest.raises(ValueError, match="synthetic_data"):
    pretrain_data.make_iterator(config, config.data, split="train", batch_size=8, vocab_size=128, seed=0)


@pytest.mark.slow
def test_main_trains_packed_and_resumes(tagged, tmp_path):
  """The real entry point with data.packing: progress shows non-padding tokens/s, eval
  counts examples (not rows), and a rerun with more steps resumes."""
  args = dict(synthetic_data=False, **{"model.vocab_size": None, "data.prepared_dir": tagged["prepared"],
              "data.vocab_path": tagged["vocab"], "data.packing": True,
              "data.max_examples_per_row": E, "data.max_seq_length": L,
              "model.max_position_embeddings": L, "data.max_predictions_per_seq": P,
              "num_train_steps": 4, "checkpoint_every_steps": 2, "eval_steps": 2,
              "eval_every_steps": 4, "eval_batch_size": 8})
  log = tu.run(tu.main_args(tmp_path, **args)).stderr
  line = next(l for l in log.splitlines() if "step 4/4" in l)
  assert "non-padding" in line, line
  fill = tu.read_scalars(tmp_path, "train/padding_fraction")
  assert all(0 <= v < 0.2 for v in fill.values()), fill
  eval_line = next(l for l in log.splitlines() if "eval at step 4" in l)
  assert int(eval_line.split("|")[-1].split()[0]) > 16  # more examples than 2 x 8 rows
  more = tu.run(tu.main_args(tmp_path, **{**args, "num_train_steps": 6})).stderr
  assert "Resumed from" in more and "step 6/6" in more
