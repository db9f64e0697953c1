"""Weighted mixtures of prepared corpora (input_pipeline/mixture.py): realised shares, the
temperature schedule, determinism, resume mid-mixture, errors; the training job's log."""
import numpy as np
import pytest

from input_pipeline import data_config
from common import errors
from input_pipeline import mixture
from input_pipeline import prepare
from input_pipeline import pretrain
from input_pipeline import testing

DOCS_PER_CORPUS = 8


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  """Three prepared corpora of one vocabulary: documents 0-7, 8-15 and 16-23 of a tagged
  corpus (a row's words name its document, hence its corpus)."""
  root = tmp_path_factory.mktemp("mix")
  whole = testing.make_tagged_corpus(str(root / "whole"), num_docs=3 * DOCS_PER_CORPUS,
                                     sentences_per_doc=(6, 12), sentence_words=(3, 10),
                                     num_shards=2)
  docs = open(whole["corpus"], encoding="utf-8").read().split("\n\n")
  paths = []
  for c, name in enumerate(["en", "de", "code"]):
    text = root / f"{name}.txt"
    text.write_text("\n\n".join(docs[c * DOCS_PER_CORPUS:(c + 1) * DOCS_PER_CORPUS]) + "\n")
    out = str(root / name)
    prepare.prepare_corpus(str(text), whole["vocab"], out, num_shards=2, num_workers=1,
                           fmt="lines", progress=False)
    paths.append(out)
  return {"paths": paths, "whole": whole}


def _cfg(spec, temperature="", **overrides):
  cfg = data_config.default_data_config()
  cfg.mixture, cfg.mixture_temperature = spec, temperature
  cfg.max_seq_length, cfg.max_predictions_per_seq = 16, 3
  cfg.nsp, cfg.shuffle_block_docs, cfg.eval_fraction = False, 4, 0.05
  cfg.prefetch_batches = 2
  cfg.update(overrides)
  return cfg


def _source(batch, whole) -> np.ndarray:
  """The corpus of each row: that of most of its words (a masked word may be replaced by a
  random one)."""
  corpus = testing.token_document(batch["input_ids"], whole["num_docs"],
                                  whole["words_per_doc"]) // DOCS_PER_CORPUS
  counts = np.stack([(corpus == c).sum(1) for c in range(3)], 1)
  assert (counts.max(1) > counts.sum(1) // 2).all()
  return counts.argmax(1)


def test_realised_shares_are_within_one_percent_of_the_weights():
  mix = mixture.Mixture([0.6, 0.3, 0.1], [(0, 1.0)], seed=3)
  for batch_size in (1, 8, 256):
    sources = np.concatenate([mix.sources(k, batch_size) for k in range(10_000 // batch_size)])
    shares = np.bincount(sources, minlength=3) / len(sources)
    assert np.abs(shares - [0.6, 0.3, 0.1]).max() < 0.01, (batch_size, shares)
  # Any window of 1,000 examples too (the sequence is evenly spread, not just on average).
  window = np.concatenate([mix.sources(k, 100) for k in range(37, 47)])
  assert np.abs(np.bincount(window, minlength=3) / 1000 - [0.6, 0.3, 0.1]).max() < 0.01
  assert not np.array_equal(mix.sources(0, 64), mixture.Mixture([0.6, 0.3, 0.1], [(0, 1.0)],
                                                                 seed=4).sources(0, 64))


def test_temperature_schedule_flattens_the_shares():
  schedule = mixture.parse_temperature("1,100:0.5,200:0.01")
  assert schedule == [(0, 1.0), (100, 0.5), (200, 0.01)]
  mix = mixture.Mixture([0.8, 0.2], schedule, seed=0)
  np.testing.assert_allclose(mix.probabilities(99), [0.8, 0.2])
  np.testing.assert_allclose(mix.probabilities(100), [2 / 3, 1 / 3])  # sqrt(4) : 1
  np.testing.assert_allclose(mix.probabilities(250), [0.5, 0.5], atol=0.01)
  for lo, hi, want in ((0, 100, 0.8), (100, 200, 2 / 3)):
    sources = np.concatenate([mix.sources(k, 100) for k in range(lo, hi)])
    assert abs((sources == 0).mean() - want) < 0.01


@pytest.mark.parametrize("spec,temperature,match", [
    (" , ", "", "names no prepared corpus"),
    ("/a:0", "", "a weight must be a positive number"),
    ("/a:-1,/b", "", "a weight must be a positive number"),
    ("/a,/a", "", "names a corpus twice"),
    ("/a,/b", "0.5,x:1", "write 'T0' or 'T0,K1:T1,K2:T2'"),
    ("/a,/b", "1,200:0.5,100:0.3", "must increase"),
    ("/a,/b", "0", "temperatures must be positive"),
])
def test_bad_mixture_configs_name_the_field(spec, temperature, match):
  cfg = _cfg(spec, temperature)
  with pytest.raises(errors.ConfigError, match=match):
    data_config.check(cfg)


def test_parse_keeps_gs_paths_and_weights():
  assert mixture.parse_mixture("gs://b/en:0.6, gs://b/de ,/local/x:2") == [
      ("gs://b/en", 0.6), ("gs://b/de", None), ("/local/x", 2.0)]
  cfg = _cfg("/a", prepared_dir="/p")
  with pytest.raises(errors.ConfigError, match="leave data.prepared_dir"):
    data_config.check(cfg)


def test_iterator_mixes_the_corpora_by_weight(corpora):
  spec = ",".join(f"{p}:{w}" for p, w in zip(corpora["paths"], (0.5, 0.3, 0.2)))
  it = pretrain.PretrainIterator(_cfg(spec), batch_size=50, seed=0)
  counts = np.zeros(3)
  for _ in range(200):  # 10,000 rows
    counts += np.bincount(_source(next(it), corpora["whole"]), minlength=3)
  assert np.abs(counts / counts.sum() - [0.5, 0.3, 0.2]).max() < 0.01, counts
  shares = it.shares()
  assert list(shares) == ["en", "de", "code"]
  np.testing.assert_allclose(list(shares.values()), counts / counts.sum())
  it.close()


def test_weights_default_to_token_counts_and_temperature_flattens(corpora):
  tokens = [prepare.load_summary(p)["tokens"] for p in corpora["paths"]]
  it = pretrain.PretrainIterator(_cfg(",".join(corpora["paths"]), "1,3:0.001"), batch_size=400,
                                 seed=1)
  first = np.bincount(_source(next(it), corpora["whole"]), minlength=3) / 400
  for _ in range(2):
    next(it)
  flat = np.bincount(_source(next(it), corpora["whole"]), minlength=3) / 400
  np.testing.assert_allclose(first, np.array(tokens) / sum(tokens), atol=0.01)
  np.testing.assert_allclose(flat, [1 / 3] * 3, atol=0.01)
  it.close()


def test_resume_mid_mixture_is_bit_identical(corpora):
  spec = ",".join(f"{p}:{w}" for p, w in zip(corpora["paths"], (0.5, 0.3, 0.2)))
  cfg = _cfg(spec, "1,6:0.3", nsp=True, packing=True, max_seq_length=32,
             max_predictions_per_seq=5, max_examples_per_row=3)
  it = pretrain.PretrainIterator(cfg, batch_size=6, seed=5)
  for _ in range(4):
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(5)]  # crosses the temperature change at batch 6
  it.close()
  again = pretrain.PretrainIterator(cfg, batch_size=6, seed=5)
  again.set_state(state)
  got = [next(again) for _ in range(5)]
  for a, b in zip(want, got):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert state["batches"] == 4 and len(state["streams"]) == 3
  assert again.get_state()["rows"] == it.get_state()["rows"]
  # A state of another mixture is refused.
  two = pretrain.PretrainIterator(_cfg(",".join(corpora["paths"][:2])), batch_size=6, seed=5)
  with pytest.raises(ValueError, match="another mixture"):
    two.set_state(state)
  again.close()
  two.close()


def test_a_fresh_mixture_can_start_at_a_step(corpora):
  cfg = _cfg(",".join(corpora["paths"]), "1,10:0.001")
  it = pretrain.PretrainIterator(cfg, batch_size=300, seed=0)
  it.set_state({"batches": 12})  # a new phase at step 12: the temperature of step 12
  share = np.bincount(_source(next(it), corpora["whole"]), minlength=3) / 300
  np.testing.assert_allclose(share, [1 / 3] * 3, atol=0.01)
  assert it.get_state()["batches"] == 13
  it.close()


def test_corpora_of_different_vocabularies_are_refused(corpora, tmp_path):
  other = testing.make_tagged_corpus(str(tmp_path / "other"), num_docs=4, words_per_doc=7)
  cfg = _cfg(f"{corpora['paths'][0]},{other['prepared']}")
  with pytest.raises(ValueError, match="must share one vocabulary"):
    pretrain.PretrainIterator(cfg, batch_size=4, seed=0)


@pytest.mark.slow
def test_training_job_logs_the_shares_and_resumes(corpora, tmp_path):
  """The main job on a mixture: each log line shows the corpora's shares (also in
  TensorBoard); a rerun with more steps resumes the mixture."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  spec = ",".join(f"{p}:{w}" for p, w in zip(corpora["paths"], (0.5, 0.3, 0.2)))
  overrides = {"build.corpus": "", "data.prepared_dir": "", "data.mixture": spec,
               "model.vocab_size": None,
               "data.vocab_path": corpora["whole"]["vocab"], "data.nsp": False,
               "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
               "data.shuffle_block_docs": 4, "data.eval_fraction": 0.1,
               "model.max_position_embeddings": 32, "global_batch_size": 20,
               "num_train_steps": 10, "log_every_steps": 5, "checkpoint_every_steps": 5,
               "eval_every_steps": 0, "eval_steps": 0, "synthetic_data": False}
  run = lambda **more: subprocess.run(
      tu.main_args(str(tmp_path / "run"), **{**overrides, **more}), cwd=tu.REPO, env=tu.env(1),
      capture_output=True, text=True, timeout=600)
  proc = run()
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = [l for l in proc.stderr.splitlines() if "step 10/10" in l]
  assert lines and "shares en 0.5" in lines[0] and "de 0.3" in lines[0], proc.stderr[-3000:]
  proc = run(num_train_steps=15)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "step 15/15" in proc.stderr


def test_inspect_shows_the_mixture_and_its_shares(corpora, capsys):
  from input_pipeline import inspect  # pylint: disable=g-import-not-at-top
  spec = ",".join(f"{p}:{w}" for p, w in zip(corpora["paths"], (0.5, 0.3, 0.2)))
  stats = inspect.main(["inspect", f"--mixture={spec}", "--max_seq_length=16",
                        "--max_predictions_per_seq=3", "--nonsp", "--batch_size=100",
                        "--num_batches=10", "--print_examples=1"])
  out = capsys.readouterr().out
  assert "Mixture of 3 prepared corpora (temperature 1):" in out
  assert f"{corpora['paths'][1]}: weight 0.3" in out
  shares = [stats[f"mixture_share/{n}"] for n in ("en", "de", "code")]
  np.testing.assert_allclose(shares, [0.5, 0.3, 0.2], atol=0.01)
  assert "mixture_share/en" in out


@pytest.mark.slow
def test_sigkill_mid_mixture_then_rerun_is_bit_identical(corpora, tmp_path):
  """The main job on a mixture with a temperature change, killed -9 while a checkpoint is
  written, then rerun: the same parameters and data state as a run never interrupted."""
  import json  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  spec = ",".join(f"{p}:{w}" for p, w in zip(corpora["paths"], (0.5, 0.3, 0.2)))
  overrides = {"build.corpus": "", "data.prepared_dir": "", "data.mixture": spec,
               "data.mixture_temperature": "1,3:0.3", "model.vocab_size": None,
               "data.vocab_path": corpora["whole"]["vocab"], "data.nsp": True,
               "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
               "data.shuffle_block_docs": 4, "data.eval_fraction": 0.1,
               "model.max_position_embeddings": 32, "global_batch_size": 12,
               "num_train_steps": 8, "log_every_steps": 2, "checkpoint_every_steps": 2,
               "keep_checkpoints": 20, "eval_every_steps": 0, "eval_steps": 0,
               "synthetic_data": False}
  args = lambda workdir: tu.main_args(str(workdir), **overrides)
  straight, broken = tmp_path / "straight", tmp_path / "broken"
  tu.run(args(straight))
  ckpt_dir = broken / "checkpoints"
  proc = subprocess.Popen(args(broken), cwd=tu.REPO, env=tu.env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    tu.wait_for(lambda: ckpt_dir.is_dir() and any(p.name.startswith("4")
                                                  for p in ckpt_dir.iterdir()), 180, "4", proc)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert 8 not in tu.checkpoint_steps(broken)
  tu.run(args(broken))
  fa, fb = tu.flat(tu.load_checkpoint(straight, 8)), tu.flat(tu.load_checkpoint(broken, 8))
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
  state = lambda w: json.loads((w / "checkpoints" / "8" / "data" / "metadata").read_text())
  assert state(straight) == state(broken)
  (host,) = state(straight)["states"]
  assert host["batches"] == 8 and sum(host["rows"]) == 8 * 12


def test_a_mixture_of_different_vocabularies_is_one_line_in_the_job(corpora, tmp_path):
  """The training job on a mixture whose corpora were prepared with different vocabularies
  (issue 35 item 7): one line naming the field and both corpora, exit 2, no traceback."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  other = testing.make_tagged_corpus(str(tmp_path / "other"), num_docs=4, words_per_doc=7)
  overrides = {"build.corpus": "", "data.prepared_dir": "", "model.vocab_size": None,
               "data.mixture": f"{corpora['paths'][0]},{other['prepared']}",
               "data.vocab_path": "", "data.nsp": False, "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
               "model.max_position_embeddings": 32, "global_batch_size": 4,
               "num_train_steps": 2, "synthetic_data": False}
  proc = subprocess.run(tu.main_args(str(tmp_path / "run"), **overrides), cwd=tu.REPO,
                        env=tu.env(1), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-4000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert "error: data.mixture:" in last and "must share one vocabulary" in last, last
