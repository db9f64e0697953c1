"""Contrastive fine-tuning (config.task=embed, bert_jax/contrastive.py): the InfoNCE loss as
its formula, the same loss with the batch on 2 devices as on one (negatives gathered across
them), the job end to end (learns, best/, resume), and bad pair files as one line."""
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import contrastive, convert, embed, embed_eval, finetune, loader, tasks
from bert_jax.configs import embed as embed_config
from common import errors
from input_pipeline import epochs, packing, pairs
from input_pipeline.tokenizer import Tokenizer
from tests import test_train_utils as tu
from tests.test_finetune import WORDS, pretrained  # noqa: F401  pylint: disable=unused-import


def _reference(a, c, w, scale, symmetric):
  """InfoNCE in float64 numpy, row by row."""
  a = a / np.linalg.norm(a, axis=-1, keepdims=True)
  c = c / np.linalg.norm(c, axis=-1, keepdims=True)
  B, C, _ = c.shape
  real = [i for i in range(B) if w[i] > 0]
  cands = [(j, k) for k in range(C) for j in real]
  loss = correct = 0.0
  for i in real:
    s = np.array([scale * a[i] @ c[j, k] for j, k in cands])
    own = cands.index((i, 0))
    li = np.log(np.exp(s).sum()) - s[own]
    if symmetric:
      back = np.array([scale * c[i, 0] @ a[j] for j in real])
      li = 0.5 * (li + np.log(np.exp(back).sum()) - back[real.index(i)])
    loss += w[i] * li
    correct += w[i] * float(np.argmax(s) == own)
  return loss, correct, float(sum(w))


@pytest.mark.parametrize("negatives", [0, 2])
@pytest.mark.parametrize("symmetric", [False, True])
def test_info_nce_is_its_formula_and_padding_rows_are_not_negatives(negatives, symmetric):
  rng = np.random.default_rng(negatives + 3 * symmetric)
  a = rng.normal(size=(5, 8))
  c = rng.normal(size=(5, 1 + negatives, 8))
  c[:, 0] += 0.5 * a  # positives nearer their anchors
  w = np.array([1, 1, 0, 1, 1], np.float32)
  got = contrastive.info_nce_sums(jnp.asarray(a, jnp.float32), jnp.asarray(c, jnp.float32),
                                  {"example_weights": jnp.asarray(w)}, scale=20.0,
                                  symmetric=symmetric)
  loss, correct, weight = _reference(a, c, w, 20.0, symmetric)
  assert float(got["loss_sum"]) == pytest.approx(loss, rel=1e-5, abs=1e-5)
  assert float(got["correct_sum"]) == correct and float(got["weight"]) == weight


_DEVICES = r"""
import json, ml_collections, numpy as np, jax
from bert_jax import contrastive, trainer as trainer_lib
from bert_jax.models import bert
from input_pipeline import epochs
from tests import test_train_utils as tu
cfg = bert.BertConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                      intermediate_size=32, max_position_embeddings=16, hidden_dropout_rate=0.0,
                      attention_dropout_rate=0.0)
config = tu.tiny_config()
config.global_batch_size = 8
config.mesh_shape = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
rng = np.random.default_rng(0)
ids = rng.integers(5, 50, (8, 3, 12)).astype(np.int32)
mask = np.ones_like(ids)
mask[:, :, 9:] = 0
batch = {"input_ids": ids[:, 0], "segment_ids": np.zeros_like(ids[:, 0]), "input_mask": mask[:, 0],
         "positive_ids": ids[:, 1], "positive_mask": mask[:, 1],
         "negative_ids": ids[:, 2:], "negative_mask": mask[:, 2:]}
mask[:4, 1, 5:] = 0  # short texts: the packed batch has fewer rows
packed = next(epochs.PackedPairBatches(batch, global_batch_size=8, num_epochs=1, seed=0,
                                       max_per_row=4, row_multiple=2))
out = {}
for n, chunk, b in ((1, 0, batch), (2, 0, batch), (2, 8, batch), (2, 0, packed)):
  model = contrastive.SentenceEncoder(cfg, "mean", chunk, 4)
  trainer = trainer_lib.build(config, model, contrastive.objective(20.0, True), batch, None,
                              devices=jax.devices()[:n], total_steps=2, eval_outputs=True)
  with trainer.activate():
    state = trainer.init()
    sums, _ = trainer.eval_step(state.params, trainer.to_global(b), jax.random.key(0))
    state, metrics = trainer.train_step(state, trainer.to_global(b), jax.random.key(1))
    sums2, _ = trainer.eval_step(state.params, trainer.to_global(b), jax.random.key(0))
  out[f"{n}:{chunk}" + (":packed" if b is packed else "")] = [
      float(sums["loss_sum"]), float(metrics["loss"]), float(sums2["loss_sum"])]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_two_devices_give_the_one_device_loss_of_the_global_batch():
  """Each anchor's negatives are the whole global batch: with its rows split over 2 devices
  the loss (and the step it takes) equals one device's on the same batch, with the gradient
  cache too."""
  out = json.loads(tu.run_python(_DEVICES, devices=2).strip().splitlines()[-1])
  np.testing.assert_allclose(out["2:0"], out["1:0"], rtol=1e-5)
  np.testing.assert_allclose(out["2:8"], out["1:0"], rtol=1e-5)
  np.testing.assert_allclose(out["2:0:packed"], out["1:0"], rtol=1e-5)


def _pairs_file(path, n, rng, negatives=False):
  """Pairs built from words: a positive repeats two of its anchor's words in another order."""
  rows = []
  for _ in range(n):
    w = list(rng.choice(WORDS, 4, replace=False))
    row = {"anchor": " ".join(w), "positive": f"{w[1]} {w[0]}"}
    if negatives:
      row["negative"] = " ".join(rng.choice([x for x in WORDS if x not in w], 2, replace=False))
    rows.append(row)
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return str(path)


def _config(tmp_path, pretrained, **overrides):  # noqa: F811
  c = embed_config.get_config()
  c.init_checkpoint, c.vocab_path = pretrained
  rng = np.random.default_rng(0)
  c.train_file = _pairs_file(tmp_path / "train.jsonl", 96, rng, negatives=True)
  c.eval_file = _pairs_file(tmp_path / "dev.jsonl", 24, rng)
  c.eval_anchor_column = c.eval_positive_column = ""
  c.negative_columns = "negative"
  c.max_seq_length = 16
  c.global_batch_size = 16
  c.eval_batch_size = 16
  c.num_epochs = 3
  c.opt.learning_rate = 1e-3
  c.log_every_steps = 1000
  c.model.hidden_dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.slow
def test_embed_job_learns_keeps_best_and_exports(tmp_path, pretrained):  # noqa: F811
  config = _config(tmp_path, pretrained)
  workdir = tmp_path / "run"
  best = finetune.finetune(config, str(workdir))
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert metrics["main_metric"] == "mrr@10" and len(metrics["epochs"]) == 3
  # ... better than the encoder it started from, on the same dev pairs
  cfg, params = loader.read(config.init_checkpoint, "encoder")
  tok = Tokenizer.from_path(config.vocab_path)
  dev = pairs.read_pairs(config.eval_file, "anchor", "positive")
  spec = embed.Spec("mean", True, 16)
  a = embed.embed_texts(cfg, params, tok, [p.anchor for p in dev], spec)
  p = embed.embed_texts(cfg, params, tok, [p.positive for p in dev], spec)
  sims = a @ p.T
  before = 100 * np.mean(1 / (1 + (sims > np.diag(sims)[:, None]).sum(-1)))
  assert best["mrr@10"] > before + 10, (best, before)
  # best/ is an embedding model: its spec, predict's and sentence-transformers' vectors agree
  assert embed.read_spec(str(workdir / "best")) == spec
  out = tmp_path / "st"
  convert.main([f"--input={workdir / 'best'}", f"--output={out}", "--to=sentence_transformers"])
  cfg2, params2 = loader.read(str(workdir / "best"), "encoder")
  ours = embed.embed_texts(cfg2, params2, tok, [d.anchor for d in dev[:5]], spec)
  st = pytest.importorskip("sentence_transformers")
  theirs = st.SentenceTransformer(str(out), device="cpu").encode([d.anchor for d in dev[:5]])
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_packed_embed_run_trains_the_model_of_an_unpacked_one(tmp_path, pretrained):  # noqa: F811
  """config.packing=True for task=embed: the same pairs each step, in fewer rows, so (without
  dropout) the same losses and the same model as one text a row."""
  out = {}
  for packed in (False, True):
    config = _config(tmp_path, pretrained, num_epochs=1, packing=packed)
    workdir = tmp_path / f"run_{packed}"
    out[packed] = finetune.finetune(config, str(workdir))
    out[packed, "params"] = loader.read(str(workdir / "best"), "encoder")[1]
  assert out[True]["mrr@10"] == pytest.approx(out[False]["mrr@10"], abs=1e-3)
  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(out[True, "params"]),
                          jax.tree.leaves(out[False, "params"])):
    np.testing.assert_allclose(g, h, atol=1e-4, rtol=0, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_scored_dev_file_picks_best_by_spearman(tmp_path, pretrained):  # noqa: F811
  rng = np.random.default_rng(1)
  lines = ["sentence1\tsentence2\tscore"] + [
      f"{' '.join(rng.choice(WORDS, 3))}\t{' '.join(rng.choice(WORDS, 3))}\t{rng.uniform(0, 5):.2f}"
      for _ in range(20)]
  (tmp_path / "sts.tsv").write_text("\n".join(lines) + "\n")
  config = _config(tmp_path, pretrained, num_epochs=1)
  config.eval_file = str(tmp_path / "sts.tsv")
  config.eval_anchor_column, config.eval_positive_column = "sentence1", "sentence2"
  finetune.finetune(config, str(tmp_path / "run"))
  metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
  assert metrics["main_metric"] == "spearman" and "pearson" in metrics["best"]
  assert (tmp_path / "run" / "dev_similarities.tsv").read_text().startswith("line\tcosine\n")


@pytest.mark.parametrize("rows,match", [
    ([{"anchor": "good movie"}], r"train.jsonl:1: no column 'positive'"),
    ([{"anchor": "good movie", "positive": "  "}], r"train.jsonl:1: 'positive' is empty"),
    ([{"anchor": "good", "positive": "great"}, {"anchor": None, "positive": "x"}],
     r"train.jsonl:2: field 'anchor' is null"),
])
def test_bad_pair_files_are_one_line_exit_2(tmp_path, pretrained, rows, match):  # noqa: F811
  config = _config(tmp_path, pretrained, negative_columns="")
  (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  with pytest.raises(errors.UserError, match=match):
    finetune.finetune(config, str(tmp_path / "run"))
  args = [sys.executable, "-m", "bert_jax.main", "--config=configs/embed.py",
          f"--config.init_checkpoint={config.init_checkpoint}",
          f"--config.vocab_path={config.vocab_path}", f"--config.train_file={config.train_file}",
          f"--config.eval_file={config.eval_file}", "--config.eval_anchor_column=",
          "--config.eval_positive_column=", f"--workdir={tmp_path / 'cli'}"]
  proc = subprocess.run(args, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len([l for l in proc.stderr.splitlines() if "Error" in l or "error" in l]) <= 1


def _pair_files(tmp_path, dev: str, name: str = "dev.tsv", **overrides):
  """configs/embed.py reading a two-pair training file and `dev` (the dev file's text)."""
  c = embed_config.get_config()
  (tmp_path / "train.jsonl").write_text('{"anchor": "good movie", "positive": "great movie"}\n'
                                        '{"anchor": "bad plot", "positive": "poor plot"}\n')
  (tmp_path / name).write_text(dev)
  c.train_file, c.eval_file = str(tmp_path / "train.jsonl"), str(tmp_path / name)
  for k, v in overrides.items():
    c[k] = v
  return c


def test_a_dev_file_scored_under_another_column_is_refused_not_ranked(tmp_path):
  """An STS file whose scores are not in config.score_column was ranked as unscored pairs
  (MRR@10 picked best/): one line naming the file, its columns and the field to set. A dev
  file of pairs only (an id or row-number column too) stays unscored."""
  read = lambda config: tasks.TASKS["embed"].read(config)[1]
  sts = "sentence1\tsentence2\tsimilarity\ngood movie\tgreat movie\t4.5\nbad plot\tfine\t1\n"
  config = _pair_files(tmp_path, sts)
  with pytest.raises(errors.UserError, match=re.escape(
      f"{config.eval_file}: no column 'score' (config.score_column), but 'similarity' holds "
      "numbers: set --config.score_column=similarity (the column of scores) to score the pairs "
      "(Spearman), or --config.score_column= to rank them unscored (MRR@10); the columns are "
      "['sentence1', 'sentence2', 'similarity'].")):
    read(config)
  config.score_column = "similarity"
  assert [p.score for p in read(config)] == [4.5, 1.0]
  config.score_column = ""
  assert [p.score for p in read(config)] == [None, None]
  for dev in ("sentence1\tsentence2\ngood movie\tgreat movie\nbad plot\tfine\n",
              "qid\tsentence1\tsentence2\tn\tsame\n17\tgood movie\tgreat\t0\t1\n"
              "3\tbad plot\tfine\t1\t1\n"):  # an id, a row number, a constant: no scores
    assert [p.score for p in read(_pair_files(tmp_path, dev))] == [None, None]
  jsonl = ('{"sentence1": "good movie", "sentence2": "great", "score": 4}\n'
           '{"sentence1": "bad plot", "sentence2": "fine"}\n')  # a scored file, a row without
  with pytest.raises(errors.UserError, match=r"dev.jsonl:2: no column 'score' \(config.score_"
                     r"column\), which other rows have: every scored pair needs its score"):
    read(_pair_files(tmp_path, jsonl, "dev.jsonl"))


def test_a_missing_column_names_the_field_of_the_file_that_lacks_it(tmp_path):
  """A dev file in the training pairs' columns was told to set config.anchor_column: the
  advice names the dev file's field (eval_anchor_column), the training file's its own."""
  dev = '{"anchor": "good movie", "positive": "great movie"}\n'
  config = _pair_files(tmp_path, dev, "dev.jsonl")
  with pytest.raises(errors.UserError, match=re.escape(
      f"{config.eval_file}:1: no column 'sentence1'; the columns are ['anchor', 'positive']: "
      "set --config.eval_anchor_column to the dev file's column of anchors "
      "(--config.eval_anchor_column= reads the training file's, anchor_column).")):
    tasks.TASKS["embed"].read(config)
  config = _pair_files(tmp_path, dev, "dev.jsonl", eval_anchor_column="",
                       eval_positive_column="", positive_column="document")
  with pytest.raises(errors.UserError, match=re.escape(
      f"{config.train_file}:1: no column 'document'; the columns are ['anchor', 'positive']: "
      "set --config.positive_column to the training file's column of positives.")):
    tasks.TASKS["embed"].read(config)


@pytest.mark.parametrize("row,fields", [("bad plot", 1), ("bad plot\tpoor plot\tawful", 3)])
def test_a_tsv_row_with_another_field_count_than_its_header_is_refused(tmp_path, row, fields):
  """A row with fewer fields was told 'no column positive ... set anchor_column'; one with
  more was cut silently: one line naming file:line, its field count and the header's."""
  train = tmp_path / "train.tsv"
  train.write_text(f"anchor\tpositive\ngood movie\tgreat movie\n{row}\n")
  config = _pair_files(tmp_path, '{"sentence1": "a", "sentence2": "b"}\n', "dev.jsonl",
                       train_file=str(train))
  with pytest.raises(errors.UserError, match=re.escape(
      f"{train}:3: {fields} field{'s' if fields > 1 else ''} where the header has 2 (anchor, "
      "positive): every row needs one field a column; fix or remove the row.")):
    tasks.TASKS["embed"].read(config)


def test_parquet_pairs_and_a_batch_of_one(tmp_path, pretrained):  # noqa: F811
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"q": ["good movie", "bad plot"], "d": ["great movie", "poor plot"]}),
                 tmp_path / "p.parquet")
  got = pairs.read_pairs(str(tmp_path / "p.parquet"), "q", "d")
  assert [(p.anchor, p.positive, p.line) for p in got] == [
      ("good movie", "great movie", 1), ("bad plot", "poor plot", 2)]
  config = _config(tmp_path, pretrained, global_batch_size=1)
  with pytest.raises(errors.ConfigError, match="global_batch_size=1"):
    finetune.finetune(config, str(tmp_path / "run"))


def test_gradient_cache_gives_the_plain_batchs_loss_and_gradients_in_less_memory():
  from bert_jax.models import bert
  cfg = bert.BertConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                        intermediate_size=32, max_position_embeddings=32, hidden_dropout_rate=0.0,
                        attention_dropout_rate=0.0)
  rng = np.random.default_rng(0)
  B, L = 16, 32
  ids = rng.integers(5, 50, (B, 3, L)).astype(np.int32)
  mask = (np.arange(L)[None, None] < rng.integers(4, L, (B, 3, 1))).astype(np.int32)
  batch = {"input_ids": ids[:, 0], "segment_ids": np.zeros_like(ids[:, 0]),
           "input_mask": mask[:, 0], "positive_ids": ids[:, 1], "positive_mask": mask[:, 1],
           "negative_ids": ids[:, 2:], "negative_mask": mask[:, 2:]}
  objective = contrastive.objective(20.0, True)
  plain = contrastive.SentenceEncoder(cfg, "mean")
  params = plain.init(jax.random.key(0), *(batch[k] for k in contrastive.INPUTS))["params"]

  def loss_fn(model):
    return jax.jit(jax.value_and_grad(lambda p: objective.batch_loss(
        objective.apply(model, p, batch, deterministic=False,
                        rngs={"dropout": jax.random.key(1)}), batch)))

  want, want_g = loss_fn(plain)(params)
  cached = contrastive.SentenceEncoder(cfg, "mean", chunk=8)
  got, got_g = loss_fn(cached)(params)
  assert float(got) == pytest.approx(float(want), rel=1e-6)
  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, h, atol=1e-5, rtol=1e-5, err_msg=jax.tree_util.keystr(path))
  memory = lambda model: loss_fn(model).lower(params).compile().memory_analysis().temp_size_in_bytes
  assert memory(cached) < 0.6 * memory(plain), (memory(cached), memory(plain))


def _pair_batch(B=12, L=24, negatives=1, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 40, (B, 2 + negatives, L)).astype(np.int32)
  lengths = np.minimum(L, rng.lognormal(1.5, 0.5, (B, 2 + negatives, 1)).astype(int) + 2)
  mask = (np.arange(L)[None, None] < lengths).astype(np.int32)
  batch = {"input_ids": ids[:, 0], "segment_ids": np.zeros_like(ids[:, 0]),
           "input_mask": mask[:, 0], "positive_ids": ids[:, 1], "positive_mask": mask[:, 1]}
  if negatives:
    batch.update(negative_ids=ids[:, 2:], negative_mask=mask[:, 2:])
  return batch


def _packed(batch, rows=None):
  ids, mask = epochs.pair_texts(batch)
  B, T, L = ids.shape
  out = packing.pack_texts(ids.reshape(B * T, L), mask.reshape(B * T, L), max_texts_per_row=8,
                           rows=rows)
  out["text_at"] = out["text_at"].reshape(B, T, 2)
  out["example_weights"] = np.ones(B, np.float32)
  return out


@pytest.mark.parametrize("family,pooling,chunk", [
    ("bert", "mean", 0), ("bert", "cls", 0), ("bert", "last", 0), ("bert", "mean", 4),
    ("modern", "mean", 0)])
def test_packed_texts_give_the_loss_and_gradients_of_one_text_a_row(family, pooling, chunk):
  """config.packing for task=embed: texts packed several to a row (attention inside each
  text, positions restarting) give each text's vector, so the loss and its gradients are
  those of the same pairs one text a row, the gradient cache included."""
  from bert_jax.models import bert, modern
  cfg = (bert.BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                         intermediate_size=32, max_position_embeddings=32,
                         hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
         if family == "bert" else
         modern.ModernConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, local_window=8, global_every=2,
                             max_position_embeddings=32))
  batch = _pair_batch()
  packed = _packed(batch, rows=16 if chunk else None)
  assert len(packed["input_ids"]) < 0.5 * 3 * len(batch["input_ids"])  # fewer rows
  objective = contrastive.objective(20.0, True)
  plain = contrastive.SentenceEncoder(cfg, pooling)
  params = plain.init(jax.random.key(0), *(batch[k] for k in contrastive.INPUTS))["params"]

  def loss_and_grad(model, b):
    return jax.jit(jax.value_and_grad(lambda p: objective.batch_loss(
        objective.apply(model, p, b, deterministic=False,
                        rngs={"dropout": jax.random.key(1)}), b)))(params)

  want, want_g = loss_and_grad(plain, batch)
  got, got_g = loss_and_grad(contrastive.SentenceEncoder(cfg, pooling, chunk), packed)
  assert float(got) == pytest.approx(float(want), rel=1e-5)
  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, h, atol=2e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_packed_pair_batches_plan_their_rows_and_resume():
  """PackedPairBatches: every batch of the run in the same number of rows (the most any
  needs, a multiple of the devices), each host its rows and its pairs, each text whole at
  its text_at; get_state / set_state continue exactly."""
  train = _pair_batch(B=40, L=16, negatives=0, seed=3)
  make = lambda index: epochs.PackedPairBatches(
      train, global_batch_size=8, num_epochs=2, seed=0, max_per_row=4, row_multiple=2,
      process_index=index, process_count=2)
  hosts = [make(0), make(1)]
  assert hosts[0].rows % 4 == 0 and hosts[0].steps_per_epoch == [5, 5]
  order = epochs.epoch_order(0, 0, 40)
  for step in range(2):
    parts = [next(h) for h in hosts]
    rows = {k: np.concatenate([p[k] for p in parts]) for k in packing.ROW_KEYS}
    assert len(rows["input_ids"]) == hosts[0].rows
    text_at = np.concatenate([p["text_at"] for p in parts])
    for i, pair in enumerate(order[8 * step:8 * step + 8]):
      for t, key in enumerate(("input_ids", "positive_ids")):
        r, s = text_at[i, t]
        mask_key = key.replace("ids", "mask")
        n = train[mask_key][pair].sum()
        np.testing.assert_array_equal(rows["input_ids"][r][rows["packed_example_ids"][r] == s + 1],
                                      train[key][pair][:n])
  state = hosts[0].get_state()
  want = next(hosts[0])
  again = make(0)
  again.set_state(state)
  got = next(again)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


def test_matryoshka_loss_is_the_sum_over_the_truncated_widths():
  rng = np.random.default_rng(5)
  a, c = rng.normal(size=(6, 8)), rng.normal(size=(6, 2, 8))
  c[:, 0] += 0.5 * a
  w = np.ones(6, np.float32)
  args = dict(scale=20.0, symmetric=False)
  got = contrastive.info_nce_sums(jnp.asarray(a), jnp.asarray(c), {}, dims=(8, 4, 2), **args)
  want = sum(_reference(a[:, :d], c[..., :d], w, 20.0, False)[0] for d in (8, 4, 2))
  assert float(got["loss_sum"]) == pytest.approx(want, rel=1e-5, abs=1e-5)
  assert float(got["correct_sum"]) == _reference(a, c, w, 20.0, False)[1]
  assert contrastive.matryoshka_dims("64, 256,128", 256) == (256, 128, 64)
  with pytest.raises(errors.ConfigError, match="1..256"):
    contrastive.matryoshka_dims("512", 256)


@pytest.mark.slow
def test_an_interrupted_embed_run_resumes_to_the_same_model(tmp_path, pretrained):  # noqa: F811
  """Stopped after 3 steps (a checkpoint, as SIGTERM or a kill after a save leaves it), then
  rerun: the best/ parameters equal those of one uninterrupted run, bit for bit."""
  def run(name, **overrides):
    config = _config(tmp_path, pretrained, num_epochs=1, **overrides)
    config.checkpoint_every_steps = 3
    return finetune.finetune(config, str(tmp_path / name))

  run("whole")
  run("parts", max_steps_per_run=3)
  assert not (tmp_path / "parts" / "best").exists()  # stopped before the epoch's end
  run("parts")
  whole = loader.read(str(tmp_path / "whole" / "best"), "encoder")[1]
  parts = loader.read(str(tmp_path / "parts" / "best"), "encoder")[1]
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
    np.testing.assert_array_equal(a, b)


def test_dev_ranks_are_computed_a_block_of_anchors_at_a_time():
  from bert_jax import tasks
  rng = np.random.default_rng(7)
  a, p = rng.normal(size=(2500, 8)), rng.normal(size=(2500, 8))
  sims = a @ p.T
  whole = (sims > np.diag(sims)[:, None]).sum(-1)
  blocks = np.concatenate([tasks._ranks_of_own(a[i:i + 1024], p, i)  # pylint: disable=protected-access
                           for i in range(0, len(a), 1024)])
  np.testing.assert_array_equal(blocks, whole)


def _beir_from_pairs(tmp_path, dev_file: str, qrels=True) -> str:
  """A BEIR-layout directory: the dev pairs' anchors as queries, their positives as documents."""
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  dev = pairs.read_pairs(dev_file, "anchor", "positive")
  (d / "queries.jsonl").write_text("".join(
      json.dumps({"_id": f"q{i}", "text": p.anchor}) + "\n" for i, p in enumerate(dev)))
  (d / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": f"d{i}", "text": p.positive}) + "\n" for i, p in enumerate(dev)))
  if qrels:
    (d / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{i}\t1\n" for i in range(len(dev))))
  return str(d)


@pytest.mark.slow
def test_beir_retrieval_is_a_dev_metric_and_picks_best(tmp_path, pretrained):  # noqa: F811
  config = _config(tmp_path, pretrained, num_epochs=2)
  config.beir_dir = _beir_from_pairs(tmp_path, config.eval_file)
  workdir = tmp_path / "run"
  best = finetune.finetune(config, str(workdir))
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert metrics["main_metric"] == "beir_ndcg@10"
  assert [set(e) >= {"mrr@10", "beir_ndcg@10", "beir_recall@100", "beir_mrr@10"}
          for e in metrics["epochs"]] == [True, True]
  assert best["beir_ndcg@10"] == max(e["beir_ndcg@10"] for e in metrics["epochs"])
  # the figure is embed_eval's on best/'s parameters
  cfg, params = loader.read(str(workdir / "best"), "encoder")
  tok = Tokenizer.from_path(config.vocab_path)
  again = embed_eval.retrieval(cfg, params, tok, embed.Spec("mean", True, 16), config.beir_dir,
                               "dev")
  assert again["ndcg@10"] == pytest.approx(best["beir_ndcg@10"], abs=1e-3)
  # best_metric chooses among the run's dev metrics, and names them when it is not one
  config.best_metric = "beir_recall@1"
  with pytest.raises(errors.ConfigError, match="beir_ndcg@10, beir_recall@100"):
    finetune.finetune(config, str(tmp_path / "other"))


def test_a_beir_directory_without_qrels_fails_before_training(tmp_path, pretrained):  # noqa: F811
  config = _config(tmp_path, pretrained)
  config.beir_dir = _beir_from_pairs(tmp_path, config.eval_file, qrels=False)
  with pytest.raises(errors.UserError, match=r"qrels/dev.tsv does not exist"):
    finetune.finetune(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "checkpoints").exists()


def _allnli_like(L=6):
  """48 training pairs as AllNLI has them: each of 12 anchors with two positives, one pair of
  each repeated whole, and 12 pairs whose anchor is another pair's positive."""
  pairs_at = [(a, 100 + 2 * a + p) for a in range(12) for p in (0, 1, 0)]
  pairs_at += [(100 + 2 * a, 200 + a) for a in range(12)]
  ids = np.zeros((len(pairs_at), 2, L), np.int32)
  for i, texts in enumerate(pairs_at):
    for t, text in enumerate(texts):
      ids[i, t, :3] = (5 + text % 50, 5 + text // 50, 4)
  mask = (ids > 0).astype(np.int32)
  return {"input_ids": ids[:, 0], "segment_ids": np.zeros_like(ids[:, 0]),
          "input_mask": mask[:, 0], "positive_ids": ids[:, 1], "positive_mask": mask[:, 1]}


def _batch_texts(batch) -> list[tuple[int, ...]]:
  """Every text (anchor and positive) of a batch, unpacked or packed, as its tokens."""
  if "text_at" not in batch:
    ids, mask = epochs.pair_texts(batch)
    return [tuple(i[m > 0].tolist()) for row_i, row_m in zip(ids, mask)
            for i, m in zip(row_i, row_m)]
  return [tuple(batch["input_ids"][r][batch["packed_example_ids"][r] == s + 1].tolist())
          for r, s in batch["text_at"].reshape(-1, 2)]


@pytest.mark.parametrize("packing_kind", ["", "texts"])
def test_no_text_repeats_within_a_contrastive_batch(packing_kind, caplog):
  """A pair repeated, or an anchor with several positives (AllNLI), used to land twice in one
  batch, its own positive scored as one of its negatives. As sentence-transformers'
  NoDuplicatesBatchSampler: no text repeats within a batch (anchors and positives alike), the
  order depends on the seed only, a resumed run gets the same batches, and the pairs moved
  to a later batch or dropped at an epoch's end are counted in the log."""
  train = _allnli_like()
  config = embed_config.get_config()
  config.update(global_batch_size=8, num_epochs=2, seed=3, max_seq_length=6,
                packing=bool(packing_kind))
  caplog.set_level("INFO")
  make = lambda: finetune._batches(config, train, packing_kind, 1)  # pylint: disable=protected-access
  batches = make()
  seen = [_batch_texts(b) for b in batches]
  assert len(seen) == sum(batches.steps_per_epoch) >= 8
  for texts in seen:
    assert len(texts) == 16 and len(set(texts)) == 16, texts
  moved, dropped = zip(*batches.deduplicated)
  assert sum(moved) > 0
  assert [48 - 8 * s for s in batches.steps_per_epoch] == list(dropped)
  assert (f"moved to a later batch: {list(moved)}; dropped at its end: {list(dropped)}"
          in caplog.text), caplog.text
  again = make()  # the same seed, the same batches; another seed, others
  assert [_batch_texts(b) for b in again] == seen
  config.seed = 4
  assert [_batch_texts(b) for b in make()] != seen
  config.seed = 3
  resumed, first = make(), make()
  for _ in range(3):
    next(first)
  resumed.set_state(json.loads(json.dumps(first.get_state())))
  assert [_batch_texts(b) for b in resumed] == seen[3:]
  one_anchor = {**train, "input_ids": np.repeat(train["input_ids"][:1], 48, 0)}
  with pytest.raises(errors.ConfigError, match="repeat their texts too much"):
    finetune._batches(config, one_anchor, packing_kind, 1)  # pylint: disable=protected-access


def test_a_checkpoint_directory_brings_its_own_vocabulary(tmp_path, pretrained, caplog):  # noqa: F811
  """Fine-tuning from a sentence-transformers (or HuggingFace) directory demanded
  --config.vocab_path although the directory holds its tokenizer: unset, the checkpoint's
  own vocabulary is taken (as predict and embed_eval do), said in the log and recorded in the
  run's config; a checkpoint without one still names the field, in one line."""
  ckpt, vocab = pretrained
  st = tmp_path / "st"
  convert.main([f"--input={ckpt}", f"--output={st}", "--to=sentence_transformers",
                f"--vocab={vocab}"])
  config = _config(tmp_path, pretrained, init_checkpoint=str(st), vocab_path="")
  caplog.set_level("INFO")
  finetune.check_config(config)
  assert config.vocab_path == str(st)
  assert f"the checkpoint's own, {st}" in caplog.text, caplog.text
  _, _, tok = finetune._load(config)  # pylint: disable=protected-access
  assert tok.vocab_size == Tokenizer.from_path(vocab).vocab_size
  config = _config(tmp_path, pretrained, vocab_path="")  # an export holding no vocabulary
  with pytest.raises(errors.ConfigError, match=r"config.vocab_path is not set and .* holds no "
                     r"vocabulary.*--config.vocab_path=PATH"):
    finetune.check_config(config)
