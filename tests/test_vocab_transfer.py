"""Vocabulary transfer (bert_jax/vocab_transfer.py, issue 60): a token both vocabularies
have keeps its row exactly, a new token's row is the mean of its old pieces' rows, the
special tokens map by role, for every pair of tokenizer kinds (WordPiece, byte-level BPE,
SentencePiece), on vocabularies trained here."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax import families, vocab_transfer
from input_pipeline.tokenizer import Tokenizer

KINDS = ("wordpiece", "bpe", "sentencepiece")


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
  """Per kind, two vocabularies of the built-in corpus: 'old' (600 entries, its first half)
  and 'new' (900 entries, all of it): most tokens shared, some new."""
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("vocabs")
  text = "\n\n".join(corpus.iter_texts("default", max_chars=160_000))
  (root / "all.txt").write_text(text)
  (root / "half.txt").write_text(text[:len(text) // 2])
  for kind in KINDS:
    vocab_lib.train_vocab(str(root / "half.txt"), str(root / f"{kind}_old"), vocab_size=600,
                          kind=kind, lowercase=True)
    vocab_lib.train_vocab(str(root / "all.txt"), str(root / f"{kind}_new"), vocab_size=900,
                          kind=kind, lowercase=True)
  return {(kind, age): Tokenizer.from_path(str(root / f"{kind}_{age}"))
          for kind in KINDS for age in ("old", "new")}


def _table(tok, width=6, seed=0):
  return np.random.default_rng(seed).normal(size=(tok.vocab_size, width)).astype(np.float32)


@pytest.mark.parametrize("old_kind", KINDS)
@pytest.mark.parametrize("new_kind", KINDS)
def test_shared_tokens_keep_their_rows_new_ones_average_their_pieces(vocabs, old_kind, new_kind):
  old, new = vocabs[old_kind, "old"], vocabs[new_kind, "new"]
  table, bias = _table(old), _table(old, 1, seed=1)[:, 0]
  plan = vocab_transfer.plan(old, new)
  got, got_bias = vocab_transfer.rows(table, plan), vocab_transfer.rows(bias, plan)
  assert got.shape == (new.vocab_size, 6) and got.dtype == np.float32
  assert got_bias.shape == (new.vocab_size,)
  # Specials by role, exactly.
  for role in vocab_transfer.ROLES:
    n, o = getattr(new, f"{role}_id"), getattr(old, f"{role}_id")
    np.testing.assert_array_equal(got[n], table[o])
    assert got_bias[n] == bias[o]
  # A word both vocabularies hold as one token keeps its row bit for bit, whatever the kinds'
  # word-start marks.
  kept = 0
  for word in ("the", "and", "of", "to", "was", "in", "his", "that"):
    n, o = new.encode(" " + word), old.encode(" " + word)
    if len(n) == len(o) == 1:
      np.testing.assert_array_equal(got[n[0]], table[o[0]])
      kept += 1
  assert kept >= 6, kept
  # Every other token: the mean of the rows of its pieces under the old tokenizer.
  specials = {getattr(new, f"{r}_id") for r in vocab_transfer.ROLES}
  checked = 0
  for i, source in enumerate(plan.sources):
    if i in specials:
      continue
    if len(source) > 1:
      np.testing.assert_allclose(got[i], table[list(source)].astype(np.float64).mean(0),
                                 rtol=1e-6, atol=1e-7)
      checked += 1
    elif not source:
      np.testing.assert_allclose(got[i], table[:old.vocab_size].mean(0), rtol=1e-5, atol=1e-6)
  assert checked > 0
  assert plan.kept + plan.by_role + plan.composed + len(plan.orphans) == new.vocab_size
  assert plan.kept >= new.vocab_size // 5, plan.summary(new.vocab_size)
  marks = {i for i, t in enumerate(old.tokens) if t in ("\u0120", "\u2581")}
  assert not any(marks & set(s) for s in plan.sources if len(s) > 1)  # no bare space averaged in


def test_random_rows_keep_the_shared_ones_and_draw_the_others(vocabs):
  old, new = vocabs["wordpiece", "old"], vocabs["sentencepiece", "new"]
  table = _table(old)
  fvt, rnd = vocab_transfer.plan(old, new), vocab_transfer.plan(old, new, mode="random")
  got, again = vocab_transfer.rows(table, rnd), vocab_transfer.rows(table, rnd)
  np.testing.assert_array_equal(got, again)  # seeded: a rerun draws the same rows
  kept = [i for i, s in enumerate(fvt.sources) if i not in rnd.drawn]
  np.testing.assert_array_equal(got[kept], vocab_transfer.rows(table, fvt)[kept])
  assert rnd.kept == fvt.kept and len(rnd.drawn) == fvt.composed + len(fvt.orphans)
  drawn = got[list(rnd.drawn)]
  assert abs(drawn.std() - table.std()) < 0.1 * table.std()
  assert "drawn at random" in rnd.summary(new.vocab_size)


def test_the_same_vocabulary_maps_every_row_to_itself(vocabs):
  tok = vocabs["wordpiece", "old"]
  plan = vocab_transfer.plan(tok, tok)
  table = _table(tok)
  np.testing.assert_array_equal(vocab_transfer.rows(table, plan), table)
  assert plan.kept + plan.by_role == tok.vocab_size and not plan.orphans


def test_a_new_token_is_the_mean_of_its_pieces(tmp_path):
  """By hand: 'cats' is new; WordPiece cuts it into 'cat' '##s'."""
  (tmp_path / "old").mkdir()
  (tmp_path / "new").mkdir()
  base = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "dog"]
  (tmp_path / "old" / "vocab.txt").write_text("\n".join(base) + "\n")
  (tmp_path / "new" / "vocab.txt").write_text(
      "\n".join(["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "cats", "dog", "zebra"]) + "\n")
  old, new = Tokenizer.from_path(str(tmp_path / "old")), Tokenizer.from_path(str(tmp_path / "new"))
  plan = vocab_transfer.plan(old, new, rows=10)  # a padded table: 2 rows past the tokens
  table = np.arange(9 * 2, dtype=np.float32).reshape(9, 2)
  got = vocab_transfer.rows(table, plan)
  np.testing.assert_array_equal(got[:5], table[[2, 3, 0, 4, 1]])  # by role
  np.testing.assert_array_equal(got[5], (table[6] + table[7]) / 2)  # cats = cat ##s
  np.testing.assert_array_equal(got[6], table[8])  # dog, kept
  np.testing.assert_allclose(got[7], table.mean(0))  # zebra: only [UNK] pieces
  np.testing.assert_allclose(got[8:], np.broadcast_to(table.mean(0), (2, 2)))  # padding
  assert (plan.kept, plan.by_role, plan.composed, plan.orphans) == (1, 5, 1, ("zebra",))
  assert "1 of 8 tokens shared" in plan.summary(8) and "'zebra'" in plan.summary(8)


@pytest.mark.parametrize("name,objective", [(n, "mlm") for n in families.names()]
                         + [("electra", "electra")])
def test_every_family_names_the_tensors_a_transfer_rebuilds(name, objective):
  """Each family's vocabulary-indexed tensors (Family.vocab_tensors) are exactly those of its
  pre-training tree with the vocabulary's size on some axis, that axis named (ELECTRA's
  generator's bias, EuroBERT's untied output projection on axis 1)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bert_jax import loader, registry  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(objective=objective)
  config.model = ml_collections.ConfigDict(dict(
      family=name, preset="tiny" if name == "bert" else None, dtype="float32",
      param_dtype="float32", num_layers=2, hidden_size=32, num_heads=2, intermediate_size=48))
  config.data.nsp = False
  model, _, sample = registry.pretraining(config, vocab_size=101)
  shapes = jax.eval_shape(lambda: model.init(
      {"params": jax.random.key(0), "dropout": jax.random.key(1)}, **sample, deterministic=True))
  flat = loader.flat(nn.unbox(shapes["params"]))
  tensors = families.get(name).vocab_tensors
  found = {(k, vocab_transfer.vocab_axis(k, tensors)) for k in flat
           if vocab_transfer.vocab_axis(k, tensors) is not None}
  indexed = {(k, axis) for k, v in flat.items() for axis, n in enumerate(v.shape) if n == 101}
  assert found and found == indexed, (found, indexed)


def _hf_bert_dir(root, vocab_dir, hidden=64):
  """A HuggingFace BertForPreTraining (random weights, tu.tiny_config's shape) with the
  WordPiece vocabulary of `vocab_dir` beside it, as the Hub ships one."""
  import shutil  # pylint: disable=g-import-not-at-top
  transformers = pytest.importorskip("transformers")
  tokens = (vocab_dir / "vocab.txt").read_text().splitlines()
  config = transformers.BertConfig(vocab_size=len(tokens), hidden_size=hidden,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=2 * hidden, max_position_embeddings=32,
                                   hidden_act="gelu_new")
  root.mkdir()
  transformers.BertForPreTraining(config).save_pretrained(root)
  shutil.copy(vocab_dir / "vocab.txt", root / "vocab.txt")
  return str(root)


def test_a_checkpoint_of_another_vocabulary_is_transferred_or_refused(vocabs, tmp_path):
  """checkpoint_source, the job's choice of first weights: the checkpoint itself for the same
  vocabulary; one line naming the fix with vocab_transfer=none; with fvt, its tensors for the
  new vocabulary (the same each time: a rerun starts bit-identical), the plan recorded."""
  import pathlib  # pylint: disable=g-import-not-at-top
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  from common import errors  # pylint: disable=g-import-not-at-top
  old_tok, new_tok = vocabs["wordpiece", "old"], vocabs["wordpiece", "new"]
  init = _hf_bert_dir(tmp_path / "hf", pathlib.Path(old_tok.path).parent, hidden=16)
  cfg = model_lib.BertConfig(vocab_size=new_tok.vocab_size)
  same = vocab_transfer.checkpoint_source(init, "none", old_tok.path, cfg, str(tmp_path))
  assert same == init
  with pytest.raises(errors.ConfigError, match="vocab_transfer=fvt") as e:
    vocab_transfer.checkpoint_source(init, "none", new_tok.path, cfg, str(tmp_path))
  assert "\n" not in str(e.value) and "another vocabulary" in str(e.value)
  got = [vocab_transfer.checkpoint_source(init, "fvt", new_tok.path, cfg, str(tmp_path))
         for _ in range(2)]
  assert got[0][0].vocab_size == new_tok.vocab_size
  _, old = loader.read(init)
  (n,), (o,) = new_tok.encode("the"), old_tok.encode("the")
  for path in (("bert", "embeddings", "word_embeddings", "embedding"), ("output_bias",)):
    a, b = list((loader.flat(g[1])[path] for g in got))
    assert a.shape[0] == new_tok.vocab_size
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[n], loader.flat(old)[path][o])
  assert "tokens shared" in json.loads((tmp_path / vocab_transfer.RECORD).read_text())["summary"]
  with pytest.raises(errors.ConfigError, match="needs the vocabulary"):
    vocab_transfer.checkpoint_source(init, "fvt", None, cfg, str(tmp_path))


@pytest.mark.slow  # three short jobs (~30-60 s on 2 cores)
def test_continued_pretraining_with_a_new_vocabulary(vocabs, tmp_path):
  """The job: a checkpoint of one vocabulary continues on data of another; refused with
  vocab_transfer=none (one line naming the fix), with fvt its shared tokens' rows are the
  checkpoint's, the plan is recorded, and a rerun (a kill before the first checkpoint) starts
  from bit-identical weights."""
  import pathlib  # pylint: disable=g-import-not-at-top
  from bert_jax import loader, train  # pylint: disable=g-import-not-at-top
  from common import errors  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  old_tok, new_tok = vocabs["wordpiece", "old"], vocabs["wordpiece", "new"]
  init = _hf_bert_dir(tmp_path / "hf", pathlib.Path(old_tok.path).parent)
  frozen = dict(num_train_steps=1, schedule__warmup_steps=5, eval_steps=0, synthetic_data=False,
                build__corpus="default", data__vocab_path=str(pathlib.Path(new_tok.path).parent),
                data__prepared_dir=str(tmp_path / "prepared"), model__vocab_size=None,
                data__nsp=False,
                init_checkpoint=init,
                model__num_layers=2, model__intermediate_size=128)
  with pytest.raises(errors.ConfigError, match="vocab_transfer=fvt") as e:
    train.train_and_evaluate(tu.tiny_config(**frozen), str(tmp_path / "none"))
  assert "\n" not in str(e.value) and "another vocabulary" in str(e.value)
  states = [train.train_and_evaluate(tu.tiny_config(vocab_transfer="fvt", **frozen),
                                     str(tmp_path / w)) for w in ("a", "b")]
  _, old = loader.read(init)
  table = np.asarray(states[0].params["bert"]["embeddings"]["word_embeddings"]["embedding"])
  assert table.shape[0] == new_tok.vocab_size
  old_table = old["bert"]["embeddings"]["word_embeddings"]["embedding"]
  for word in ("the", "and", "of"):
    (n,), (o,) = new_tok.encode(word), old_tok.encode(word)
    np.testing.assert_array_equal(table[n], old_table[o])
    np.testing.assert_array_equal(np.asarray(states[0].params["output_bias"])[n],
                                  old["output_bias"][o])
  record = json.loads((tmp_path / "a" / vocab_transfer.RECORD).read_text())
  assert record["mode"] == "fvt" and "tokens shared" in record["summary"]
  a, b = tu.flat(states[0].params), tu.flat(states[1].params)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # The export carries the new tokenizer: transformers loads it with every key, tokenizes as
  # the run did, and gives the run's masked-LM logits.
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  convert.main([f"--input={tmp_path / 'a'}", f"--output={tmp_path / 'hf_new'}",
                "--to=huggingface"])
  back, info = transformers.AutoModelForMaskedLM.from_pretrained(
      tmp_path / "hf_new", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf_new")
  text = "the old man and the sea"
  ids = tok(text)["input_ids"]
  assert ids == [new_tok.cls_id] + new_tok.encode(text) + [new_tok.sep_id]
  with torch.no_grad():
    logits = back.eval()(input_ids=torch.tensor([ids])).logits.numpy()
  assert logits.shape[-1] == new_tok.vocab_size
  cfg_a, params_a = loader.read(str(tmp_path / "a"))
  ours = families.of(cfg_a).masked_lm(cfg_a, False).apply(
      {"params": params_a}, np.asarray([ids]), np.zeros((1, len(ids)), np.int32),
      np.ones((1, len(ids)), np.int32), np.arange(len(ids))[None])["mlm_logits"]
  np.testing.assert_allclose(np.asarray(ours), logits, atol=1e-4)


# Each family's checkpoint with a tokenizer of its own kind, moved to a vocabulary of another.
FAMILY_KINDS = {"bert": ("wordpiece", "bpe"), "roberta": ("bpe", "wordpiece"),
                "xlm-roberta": ("sentencepiece", "bpe"), "electra": ("wordpiece", "sentencepiece"),
                "deberta-v2": ("sentencepiece", "wordpiece"), "modernbert": ("bpe", "sentencepiece"),
                "eurobert": ("bpe", "wordpiece")}


def test_every_family_is_named_with_a_pair_of_kinds():
  assert set(FAMILY_KINDS) == set(families.names())
  assert {pair for pair in FAMILY_KINDS.values()} >= {(a, b) for a in KINDS for b in KINDS
                                                      if a != b}


@pytest.mark.parametrize("name", sorted(FAMILY_KINDS))
def test_every_family_checkpoint_is_transferred_as_the_hub_ships_it(vocabs, tmp_path, name):
  """A HuggingFace directory of each family (random weights; ELECTRA's pre-training pair) with
  a tokenizer of its kind, transferred to another kind's vocabulary by the job's own entry
  (checkpoint_source): every tensor Family.vocab_tensors names is rebuilt along its axis, a
  word both vocabularies hold as one token keeps its rows there exactly, the specials map by
  role, every other tensor is untouched."""
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  from tests import test_conformance as conf  # pylint: disable=g-import-not-at-top
  old_kind, new_kind = FAMILY_KINDS[name]
  old, new = vocabs[old_kind, "old"], vocabs[new_kind, "new"]
  row = conf.ROWS[name]
  arch = "ForPreTraining" if name == "electra" else "ForMaskedLM"
  init, _ = row.hf_dir(tmp_path, arch, vocab_size=old.vocab_size)
  for f in __import__("pathlib").Path(old.path).parent.iterdir():
    shutil.copy(f, init)
  before_cfg, before = loader.read(init, "pretraining", require_mlm=False)
  cfg = before_cfg.replace(vocab_size=new.vocab_size + 3)  # a padded table
  got_cfg, got = vocab_transfer.checkpoint_source(init, "fvt", new.path, cfg, str(tmp_path))
  assert got_cfg.vocab_size == new.vocab_size + 3
  tensors = families.get(name).vocab_tensors
  flat_before, flat_after = loader.flat(before), loader.flat(got)
  assert flat_before.keys() == flat_after.keys()
  pairs = [(n[0], o[0]) for n, o in ((new.encode(" " + w), old.encode(" " + w))
                                      for w in ("the", "and", "of", "to", "was", "his"))
           if len(n) == len(o) == 1]
  pairs += [(getattr(new, f"{r}_id"), getattr(old, f"{r}_id")) for r in vocab_transfer.ROLES]
  assert len(pairs) >= 8, pairs
  rebuilt = 0
  for keys, value in flat_after.items():
    axis = vocab_transfer.vocab_axis(keys, tensors)
    if axis is None:
      np.testing.assert_array_equal(value, flat_before[keys], err_msg="/".join(keys))
      continue
    rebuilt += 1
    a, b = np.moveaxis(np.asarray(value), axis, 0), np.moveaxis(flat_before[keys], axis, 0)
    assert a.shape[0] == new.vocab_size + 3 and a.shape[1:] == b.shape[1:], keys
    for n, o in pairs:
      np.testing.assert_array_equal(a[n], b[o], err_msg="/".join(keys))
  # the table and the output bias (EuroBERT: its untied output projection); ELECTRA's
  # discriminator has the table alone (the generator of a run of ours is named by
  # test_every_family_names_the_tensors_a_transfer_rebuilds)
  assert rebuilt == (1 if name == "electra" else 2), rebuilt


@pytest.mark.slow  # four short sharded jobs (~2 min on 2 cores)
def test_continued_pretraining_with_a_new_vocabulary_sharded_and_killed(vocabs, tmp_path):
  """The transfer on a mesh (2 devices, fsdp=2): the job starts from the host's transferred
  weights (a shared token's row is the checkpoint's after a step at lr 0), and a run killed -9
  while writing its first checkpoint (it transfers again on the rerun), then again once that
  checkpoint is safe (it resumes it), ends bit-identical to one that ran through."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  old_tok, new_tok = vocabs["wordpiece", "old"], vocabs["bpe", "new"]
  init = _hf_bert_dir(tmp_path / "hf", pathlib.Path(old_tok.path).parent)
  args = lambda workdir: tu.main_args(workdir, **{
      "model.vocab_size": None, "synthetic_data": False, "build.corpus": "default",
      "data.vocab_path": str(pathlib.Path(new_tok.path).parent),
      "data.prepared_dir": str(tmp_path / "prepared"), "data.nsp": False,
      "init_checkpoint": init, "vocab_transfer": "fvt", "model.num_layers": 2,
      "model.intermediate_size": 128, "mesh_shape.data": 1, "mesh_shape.fsdp": 2,
      "num_train_steps": 4, "schedule.warmup_steps": 4, "checkpoint_every_steps": 1,
      "keep_checkpoints": 10, "eval_steps": 0})
  through, killed = tmp_path / "through", tmp_path / "killed"
  tu.run(args(through), devices=2)
  first = tu.load_checkpoint(through, 1)["params"]
  _, old = loader.read(init)
  table = first["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert table.shape[0] == new_tok.vocab_size
  for word in ("the", "and", "of"):
    (n,), (o,) = new_tok.encode(" " + word), old_tok.encode(word)
    np.testing.assert_array_equal(table[n], old["bert"]["embeddings"]["word_embeddings"][
        "embedding"][o])

  def kill_when(prefix):
    proc = subprocess.Popen(args(killed), cwd=tu.REPO, env=tu.env(2),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      tu.wait_for(lambda: (killed / "checkpoints").is_dir() and any(
          p.name.startswith(prefix) for p in (killed / "checkpoints").iterdir()), 240, prefix,
                  proc)
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()

  kill_when("1")  # mid-save of the first checkpoint: the rerun starts (and transfers) afresh
  kill_when("2")  # step 1 is safe by now: the rerun resumes it
  assert 4 not in tu.checkpoint_steps(killed)
  tu.run(args(killed), devices=2)
  a, b = tu.flat(tu.load_checkpoint(through, 4)), tu.flat(tu.load_checkpoint(killed, 4))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _bad_vocab_dir(root, lines):
  root.mkdir()
  (root / "vocab.txt").write_text("".join(line + "\n" for line in lines))
  return root


@pytest.mark.parametrize("which", ["data's", "checkpoint's"])
@pytest.mark.parametrize("lines", [[], ["", ""], ["the", "cat"]], ids=["empty", "blank", "no specials"])
def test_a_vocabulary_the_transfer_cannot_map_is_one_line(vocabs, tmp_path, which, lines):
  """An empty file, blank lines, or no special tokens, on either side: one line naming the
  file, and nothing written to the workdir."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  from common import errors  # pylint: disable=g-import-not-at-top
  good = pathlib.Path(vocabs["wordpiece", "old"].path).parent
  init = pathlib.Path(_hf_bert_dir(tmp_path / "hf", good, hidden=16))
  bad = _bad_vocab_dir(tmp_path / "bad", lines)
  data = str(bad)
  if which == "checkpoint's":
    shutil.copy(bad / "vocab.txt", init / "vocab.txt")
    data = str(vocabs["wordpiece", "new"].path)
  work = tmp_path / "work"
  work.mkdir()
  with pytest.raises(errors.UserError) as e:
    vocab_transfer.checkpoint_source(str(init), "fvt", data, model_lib.BertConfig(vocab_size=900),
                                     str(work))
  assert "\n" not in str(e.value) and "vocab.txt" in str(e.value), str(e.value)
  assert not list(work.iterdir())


@pytest.mark.slow  # the job on the built-in corpus (~20 s)
def test_the_job_with_a_checkpoint_whose_vocabulary_is_empty_exits_2(vocabs, tmp_path):
  import pathlib  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  init = pathlib.Path(_hf_bert_dir(tmp_path / "hf", pathlib.Path(vocabs["wordpiece", "old"].path).parent))
  (init / "vocab.txt").write_text("")
  out = tu.run(tu.main_args(tmp_path / "work", **{
      "model.vocab_size": None, "synthetic_data": False, "build.corpus": "default",
      "data.vocab_path": str(pathlib.Path(vocabs["wordpiece", "new"].path).parent),
      "data.prepared_dir": str(tmp_path / "prepared"), "data.nsp": False,
      "init_checkpoint": str(init), "vocab_transfer": "fvt", "model.num_layers": 2,
      "model.intermediate_size": 128}), check=False)
  assert out.returncode == 2, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("main.py: error: ") and str(init / "vocab.txt") in last, last
  assert not tu.checkpoint_steps(tmp_path / "work")  # nothing saved


@pytest.mark.slow  # one short ELECTRA job (~20 s)
def test_electra_continues_from_a_discriminator_with_a_new_vocabulary(vocabs, tmp_path):
  """ELECTRA's objective from a Hub ELECTRA discriminator (ElectraForPreTraining) on data of
  another vocabulary: the discriminator's table is transferred (a shared token keeps its row
  through a step at lr 0), the generator starts fresh at the new size, the job evaluates."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  transformers = pytest.importorskip("transformers")
  old_tok, new_tok = vocabs["wordpiece", "old"], vocabs["sentencepiece", "new"]
  init = tmp_path / "hf"
  transformers.ElectraForPreTraining(transformers.ElectraConfig(
      vocab_size=old_tok.vocab_size, embedding_size=32, hidden_size=64, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)).save_pretrained(init)
  shutil.copy(old_tok.path, init / "vocab.txt")
  out = tu.run(tu.main_args(tmp_path / "work", **{
      "model.vocab_size": None, "synthetic_data": False, "build.corpus": "default",
      "data.vocab_path": str(pathlib.Path(new_tok.path).parent),
      "data.prepared_dir": str(tmp_path / "prepared"), "data.nsp": False,
      "init_checkpoint": str(init), "vocab_transfer": "fvt", "objective": "electra",
      "model.family": "electra", "model.preset": "electra-small", "model.num_layers": 2,
      "model.hidden_size": 64, "model.num_heads": 4, "model.intermediate_size": 128,
      "model.embedding_size": 32, "model.max_position_embeddings": 64, "num_train_steps": 1,
      "schedule.warmup_steps": 4, "eval_steps": 1}))
  assert "eval at step 1" in out.stderr and "disc_loss" in out.stderr
  _, old = loader.read(str(init))
  params = tu.load_checkpoint(tmp_path / "work")["params"]
  table = loader.flat(params)
  keys = [k for k in table if k[-2:] == ("word_embeddings", "embedding")]
  key = next(k for k in keys if not any("generator" in part for part in k))
  assert table[key].shape[0] == new_tok.vocab_size
  for word in ("the", "and", "of"):
    (n,), (o,) = new_tok.encode(" " + word), old_tok.encode(word)
    np.testing.assert_array_equal(table[key][n],
                                  old["bert"]["embeddings"]["word_embeddings"]["embedding"][o])
