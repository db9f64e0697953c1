"""Packed classification fine-tuning: same loss/gradients as unpacked, no cross-talk, end to end."""
import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import finetune, heads, objectives, sharding, tasks
from bert_jax.models import bert as model_lib
from bert_jax.configs import classify_custom, squad
from input_pipeline import epochs, features, packing
from input_pipeline.tokenizer import Tokenizer
from tests.test_finetune import _sentiment, pretrained  # noqa: F401  (module fixture)

CFG = model_lib.BertConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                           max_position_embeddings=64, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
L = 32


def _examples(n=7, num_labels=3, seed=0):
  """Classification features at max_seq_length L: [CLS] a [SEP] (b [SEP]), varied lengths."""
  rng = np.random.default_rng(seed)
  f = {k: np.zeros((n, L), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  f["labels"] = (rng.integers(0, num_labels, n).astype(np.int32) if num_labels > 1
                 else rng.normal(size=n).astype(np.float32))
  for i in range(n):
    la, lb = rng.integers(1, 7, size=2)
    ids = [2] + list(rng.integers(5, 60, la)) + [3] + (list(rng.integers(5, 60, lb)) + [3] if i % 2 else [])
    f["input_ids"][i, :len(ids)] = ids
    f["input_mask"][i, :len(ids)] = 1
    f["segment_ids"][i, la + 2:len(ids)] = 1
  return f


def _loss_fn(model, objective, batch):
  """What trainer.train_step differentiates (dropout rate 0)."""
  def loss(params):
    outputs = objective.apply(model, params, batch, deterministic=False,
                              rngs={"dropout": jax.random.key(0)})
    sums = objective.sums(outputs, batch)
    return objective.loss(sums, objective.denominators(batch)), sums
  return loss


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
@pytest.mark.parametrize("num_labels", [pytest.param(3, marks=pytest.mark.slow), 1])  # 3: ~40 s
def test_packed_loss_and_gradients_equal_unpacked(num_labels):
  f = _examples(num_labels=num_labels)
  packed = epochs.pack_epoch(f, np.arange(len(f["input_ids"])), L, max_examples_per_row=4)
  R, E = packed["input_ids"].shape[0], packed["cls_positions"].shape[1]
  assert R < 7 and E == 4  # Really packed, several examples a row.
  assert packed["example_weights"].sum() == 7 and packed["labels"].shape == (R, E)
  head = heads.BertForSequenceClassification(CFG, num_labels=num_labels)
  params = nn.unbox(head.init(jax.random.key(0), *(jnp.asarray(f[k]) for k in features.TEXT)))["params"]
  objective = objectives.supervised(heads.classification_sums, "example_weights")
  packed_objective = objective.replace(keyword_inputs=features.PACKED)
  logits = packed_objective.apply(head, params, packed)
  assert logits.shape == (R, E, num_labels)
  (l1, s1), g1 = jax.value_and_grad(_loss_fn(head, objective, f), has_aux=True)(params)
  (l2, s2), g2 = jax.value_and_grad(_loss_fn(head, packed_objective, packed),
                                    has_aux=True)(params)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  assert float(s1["weight"]) == float(s2["weight"]) == 7.0  # Examples, not rows or slots.
  np.testing.assert_allclose(s1["correct_sum"], s2["correct_sum"])
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), g1, g2)
  # Each filled slot's logits are its example's unpacked logits (the packer may fill an
  # earlier row, so slots are matched to examples through a per-example index).
  unpacked = head.apply({"params": params}, *(f[k] for k in features.TEXT))
  index = epochs.pack_epoch(dict(f, index=np.arange(7)), np.arange(7), L, 4)["index"]
  filled = packed["example_weights"] > 0
  np.testing.assert_allclose(np.asarray(logits)[filled], np.asarray(unpacked)[index[filled]], atol=1e-5)


def test_classification_loss_flattens_packed_slots():
  logits = jnp.log(jnp.array([[[0.4, 0.6], [0.9, 0.1], [0.2, 0.8]]]))  # [R=1, E=3, C=2]
  batch = {"labels": jnp.array([[0, 0, 1]]), "example_weights": jnp.array([[1.0, 1.0, 0.0]])}
  loss = objectives.supervised(heads.classification_sums).batch_loss(logits, batch)
  m = heads.classification_sums(logits, batch)
  np.testing.assert_allclose(loss, -(np.log(0.4) + np.log(0.9)) / 2, rtol=1e-6)
  assert float(m["weight"]) == 2.0 and float(m["correct_sum"]) == 1.0


def test_packed_examples_do_not_see_each_other():
  f = _examples(n=2, seed=3)
  packed = epochs.pack_epoch(f, np.arange(2), L, max_examples_per_row=2)
  assert packed["input_ids"].shape[0] == 1
  head = heads.BertForSequenceClassification(CFG, num_labels=3)
  params = nn.unbox(head.init(jax.random.key(1), *(jnp.asarray(f[k]) for k in features.TEXT)))
  run = lambda ids: np.asarray(head.apply(params, ids, packed["segment_ids"], packed["input_mask"],
                                          **{k: packed[k] for k in features.PACKED}))
  changed = packed["input_ids"].copy()
  second = packed["packed_example_ids"][0] == 2
  changed[0, second] = 7  # Rewrite example 2 entirely.
  before, after = run(packed["input_ids"]), run(changed)
  np.testing.assert_allclose(after[0, 0], before[0, 0], atol=1e-6)
  assert np.abs(after[0, 1] - before[0, 1]).max() > 1e-4  # ... which did change example 2.


def _config(tmp_path, pretrained, n=64, rows_per_batch=2, epochs=1):
  """Custom CSV sentiment fine-tuning, packed up to 4 examples a row of L tokens."""
  rows = _sentiment(np.random.default_rng(2), n)
  (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{s},{['neg', 'pos'][l]}\n" for s, l in rows))
  c = classify_custom.get_config()
  c.train_file = c.eval_file = str(tmp_path / "train.csv")
  c.init_checkpoint, c.vocab_path = pretrained
  c.max_seq_length, c.num_epochs = L, epochs
  c.global_batch_size, c.eval_batch_size, c.log_every_steps = rows_per_batch, 16, 1000
  c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
  c.opt.learning_rate = 3e-3
  c.packing, c.packed_batch, c.max_examples_per_row = True, "rows", 4
  return c


def test_packed_finetuning_end_to_end(tmp_path, pretrained):
  c = _config(tmp_path, pretrained, epochs=5)
  best = finetune.finetune(c, str(tmp_path / "work"))
  # global_batch_size=2 counts rows of up to 4 examples: far fewer steps than 64 // 2 examples.
  metrics = json.loads((tmp_path / "work" / "metrics.json").read_text())
  steps = [e["step"] for e in metrics["epochs"]]
  feats = tasks.classification_task(c, Tokenizer.from_path(pretrained[1]), CFG).train
  rows = [len(epochs.pack_epoch(feats, np.random.default_rng([c.seed, e]).permutation(64), L, 4)
              ["input_ids"]) for e in range(5)]
  assert steps == list(np.cumsum([r // 2 for r in rows])), (steps, rows)
  assert max(rows) <= 64 // 2  # At least 2 examples a row (each is ~7 tokens of 32).
  assert best["accuracy"] >= 0.9, best  # It learns (the label is one word).


def test_packed_batch_of_examples_trains_the_unpacked_runs_model(tmp_path, pretrained):  # noqa: F811
  """--config.packed_batch=examples: each batch of global_batch_size examples packed into the
  rows it needs (the same batches, steps and hyperparameters as unpacked), so without
  dropout the run trains the unpacked run's model, on fewer rows a step. config.packing unset
  (the default) packs them so."""
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  out = {}
  for packed in (False, True, None):
    c = _config(tmp_path, pretrained, rows_per_batch=8, epochs=2)
    c.packing, c.packed_batch = packed, "examples"
    work = tmp_path / f"work_{packed}"
    out[packed] = finetune.finetune(c, str(work))
    out[packed, "steps"] = [e["step"] for e in json.loads((work / "metrics.json").read_text())["epochs"]]
    out[packed, "params"] = loader.read(str(work / "best"), "all")[1]
  assert out[True, "steps"] == out[False, "steps"] == out[None, "steps"] == [8, 16]
  assert out[True]["accuracy"] == out[False]["accuracy"] == out[None]["accuracy"]
  for a, b in zip(jax.tree.leaves(out[None, "params"]), jax.tree.leaves(out[True, "params"])):
    np.testing.assert_array_equal(a, b)  # unset: the packed run itself
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(out[True, "params"]),
                          jax.tree.leaves(out[False, "params"])):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=jax.tree_util.keystr(path))
  feats = tasks.classification_task(c, Tokenizer.from_path(pretrained[1]), CFG).train
  batches = epochs.PackedExampleBatches(feats, global_batch_size=8, num_epochs=2, seed=c.seed,
                                        max_per_row=4)
  assert batches.rows < 8 and batches.steps_per_epoch == [8, 8]  # fewer rows than examples
  first = next(batches)
  assert first["input_ids"].shape == (batches.rows, L) and first["example_weights"].sum() == 8


def test_packing_unset_packs_where_it_can_and_saves_rows(tmp_path, pretrained, monkeypatch):  # noqa: F811
  """config.packing unset: classification with short examples packs each batch (fewer rows,
  the same examples); not where the examples fill their rows, nor for a feature-based
  head, a left-to-right model, batches counted in rows or a task that does not classify."""
  c = _config(tmp_path, pretrained, rows_per_batch=8)
  c.packing, c.packed_batch = None, "examples"
  assert finetune.packs(c, CFG)
  feats = tasks.classification_task(c, Tokenizer.from_path(pretrained[1]), CFG).train
  batches = finetune._batches(c, feats, "examples", 1, auto=True)
  assert isinstance(batches, epochs.PackedExampleBatches) and batches.rows == 2 < 8
  assert next(batches)["example_weights"].sum() == 8
  # Two hosts of one device each: the rows a multiple of the 2 devices, each host one.
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  two_hosts = finetune._batches(c, feats, "examples", 2, auto=True)
  assert two_hosts.rows == 2 and next(two_hosts)["input_ids"].shape == (1, L)
  monkeypatch.undo()
  # Examples as long as their rows: packing would save nothing, so the batches stay unpacked.
  full = dict(feats, input_mask=np.ones_like(feats["input_mask"]))
  batches = finetune._batches(c, full, "examples", 1, auto=True)
  assert isinstance(batches, epochs.EpochIterator) and next(batches)["input_ids"].shape == (8, L)
  assert isinstance(finetune._batches(c, full, "examples", 1, auto=False),
                    epochs.PackedExampleBatches)  # --config.packing=True packs anyway
  assert not finetune.packs(c, dataclasses.replace(CFG, causal=True))
  assert not finetune.packs(_with(c, freeze_encoder=True, features="last"), CFG)
  assert not finetune.packs(_with(c, packed_batch="rows"), CFG)
  squad_config = squad.get_config("v1")
  assert squad_config.get("packing") is None and not finetune.packs(squad_config, CFG)


def _with(c, **fields):
  """A copy of config `c` with `fields` set."""
  c = c.copy_and_resolve_references()
  for k, v in fields.items():
    c[k] = v
  return c


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_packed_finetuning_resumes_mid_epoch(tmp_path, pretrained, monkeypatch):
  c = _config(tmp_path, pretrained, n=32, epochs=2)
  full = finetune.finetune(c, str(tmp_path / "full"))

  class Killed(Exception):
    pass

  calls = {"n": 0}
  real = sharding.host_to_global

  def dying(batch, sh):
    if "labels" in batch:  # a training batch (eval batches carry no labels)
      calls["n"] += 1
      if calls["n"] == 3:
        raise Killed()
    return real(batch, sh)

  c.checkpoint_every_steps = 1
  monkeypatch.setattr(sharding, "host_to_global", dying)
  with pytest.raises(Killed):
    finetune.finetune(c, str(tmp_path / "resumed"))
  monkeypatch.setattr(sharding, "host_to_global", real)
  c.packing = False  # The checkpoint's offset counts rows: refuse to read it as examples.
  with pytest.raises(ValueError, match="same --config.packing"):
    finetune.finetune(c, str(tmp_path / "resumed"))
  c.packing = True
  resumed = finetune.finetune(c, str(tmp_path / "resumed"))
  assert resumed == full  # Same rows, same steps, same result after a kill at step 2.


def test_packing_other_tasks_is_a_clear_error(tmp_path):
  c = squad.get_config("v1")
  c.init_checkpoint, c.packing = str(tmp_path), True
  with pytest.raises(ValueError, match="packing is only supported for classification fine-tuning"):
    finetune.finetune(c, str(tmp_path / "work"))
