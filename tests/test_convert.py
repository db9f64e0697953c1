"""Checkpoint interop: parity with transformers (PyTorch), TF checkpoints, export round trip."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

from bert_jax import convert, formats, loader  # noqa: E402
from bert_jax.models import bert_formats  # noqa: E402
from bert_jax.models import bert as model_lib  # noqa: E402
from bert_jax import objectives  # noqa: E402

SHAPES = {
    # Odd on purpose: head dim 32, intermediate not 4H, 3 segment types, 77 positions.
    "odd": dict(vocab_size=123, hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
                intermediate_size=200, type_vocab_size=3, max_position_embeddings=77,
                hidden_act="gelu"),
    "tanh": dict(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=128, type_vocab_size=2, max_position_embeddings=40,
                 hidden_act="gelu_new"),
}


def _hf_model(shape: str, seed: int = 0, cls=None):
  torch.manual_seed(seed)
  cfg = transformers.BertConfig(**SHAPES[shape], attn_implementation="eager")
  model = (cls or transformers.BertForPreTraining)(cfg).eval()
  with torch.no_grad():
    # Random init leaves LayerNorm at 1/0 and output bias at 0: perturb every
    # tensor so the parity check sees each one.
    for name, p in model.named_parameters():
      p.add_(torch.randn_like(p) * (0.1 if ("LayerNorm" in name or "bias" in name) else 0.02))
  return model


def _batch(cfg, seed=0, batch=3, length=19, preds=5):
  rng = np.random.default_rng(seed)
  lengths = np.array([length, 11, 7])[:batch]
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
  ids = rng.integers(1, cfg["vocab_size"], size=(batch, length)) * mask
  segments = rng.integers(0, cfg["type_vocab_size"], size=(batch, length)) * mask
  positions = np.stack([np.sort(rng.choice(n, size=preds, replace=False)) for n in lengths])
  weights = np.ones((batch, preds), np.float32)
  weights[2, 3:] = 0.0  # Padding predictions carry weight 0.
  mlm_ids = rng.integers(0, cfg["vocab_size"], size=(batch, preds))
  nsp = rng.integers(0, 2, size=batch)
  return dict(input_ids=ids, segment_ids=segments, input_mask=mask, masked_lm_positions=positions,
              masked_lm_ids=mlm_ids, masked_lm_weights=weights, next_sentence_labels=nsp)


def _hf_outputs(model, b):
  labels = np.full(b["input_ids"].shape, -100)
  for i in range(labels.shape[0]):
    for p, t, w in zip(b["masked_lm_positions"][i], b["masked_lm_ids"][i], b["masked_lm_weights"][i]):
      if w > 0:
        labels[i, p] = t
  tt = lambda x: torch.tensor(x)
  with torch.no_grad():
    out = model(input_ids=tt(b["input_ids"]), attention_mask=tt(b["input_mask"]),
                token_type_ids=tt(b["segment_ids"]), labels=tt(labels),
                next_sentence_label=tt(b["next_sentence_labels"]), output_hidden_states=True)
    base = model.bert(input_ids=tt(b["input_ids"]), attention_mask=tt(b["input_mask"]),
                      token_type_ids=tt(b["segment_ids"]))
  gathered = np.take_along_axis(out.prediction_logits.numpy(), b["masked_lm_positions"][..., None], 1)
  return dict(sequence=base.last_hidden_state.numpy(), pooled=base.pooler_output.numpy(),
              mlm_logits=gathered, nsp_logits=out.seq_relationship_logits.numpy(), loss=float(out.loss))


def _ours(cfg, params, b):
  m = model_lib.BertForPreTraining(cfg)
  j = {k: jnp.asarray(v) for k, v in b.items()}
  out = m.apply({"params": params}, j["input_ids"], j["segment_ids"], j["input_mask"],
                j["masked_lm_positions"])
  seq, pooled = model_lib.BertModel(cfg).apply({"params": params["bert"]}, j["input_ids"],
                                               j["segment_ids"], j["input_mask"])
  loss = objectives.pretraining().batch_loss(out, j)
  return dict(sequence=np.asarray(seq), pooled=np.asarray(pooled), loss=float(loss),
              mlm_logits=np.asarray(out["mlm_logits"]), nsp_logits=np.asarray(out["nsp_logits"]))


def _max_errors(ours, ref):
  return {k: float(np.max(np.abs(np.asarray(ours[k]) - np.asarray(ref[k])))) for k in ref}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_huggingface_import_matches_transformers(tmp_path, shape, fmt):
  hf = _hf_model(shape)
  if fmt == "safetensors":
    hf.save_pretrained(tmp_path)
  else:
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
  cfg, params = loader.read(str(tmp_path))
  assert cfg.hidden_act == ("gelu" if SHAPES[shape]["hidden_act"] == "gelu" else "gelu_tanh")
  b = _batch(SHAPES[shape])
  errors = _max_errors(_ours(cfg, params, b), _hf_outputs(hf, b))
  print(f"parity {shape}/{fmt}: {errors}")
  assert max(errors.values()) <= 1e-5, errors


def test_export_to_transformers_round_trips_exactly(tmp_path):
  hf = _hf_model("odd", seed=1)
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = loader.read(str(tmp_path / "hf"))
  bert_formats.export_huggingface(str(tmp_path / "export"), cfg, params)
  reloaded = transformers.BertForPreTraining.from_pretrained(tmp_path / "export").eval()
  ref = hf.state_dict()
  for name, value in reloaded.state_dict().items():
    assert torch.equal(value, ref[name]), name
  # And back again: bit-identical parameters.
  cfg2, params2 = loader.read(str(tmp_path / "export"))
  assert cfg2 == cfg
  _assert_trees_equal(params, params2)
  # Our native format too, also into a scanned model.
  formats.save_native(str(tmp_path / "native"), cfg, params)
  cfg3, params3 = loader.read(str(tmp_path / "native"))
  params3 = loader.to_layout(params3, True)
  _assert_trees_equal(loader.to_layout(params, True), params3)


def _assert_trees_equal(a, b):
  import jax
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


def test_encoder_only_checkpoint_without_prefix_or_heads(tmp_path):
  hf = _hf_model("tanh", cls=transformers.BertModel)
  hf.save_pretrained(tmp_path)
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["architectures"] == ["BertModel"]
  # The NSP head is optional; the masked-LM head is what target="pretraining" needs.
  with pytest.raises(formats.CheckpointMismatchError, match=r"(?s)no masked-LM head \(cls.predictions.\*\).*target='encoder'"):
    loader.read(str(tmp_path))
  cfg, params = loader.read(str(tmp_path), target="encoder")
  b = _batch(SHAPES["tanh"])
  j = {k: jnp.asarray(v) for k, v in b.items()}
  seq, pooled = model_lib.BertModel(cfg).apply({"params": params}, j["input_ids"], j["segment_ids"], j["input_mask"])
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(b["input_ids"]), attention_mask=torch.tensor(b["input_mask"]),
             token_type_ids=torch.tensor(b["segment_ids"]))
  assert np.max(np.abs(np.asarray(seq) - ref.last_hidden_state.numpy())) <= 1e-5
  assert np.max(np.abs(np.asarray(pooled) - ref.pooler_output.numpy())) <= 1e-5


def test_pretraining_checkpoint_loads_as_encoder(tmp_path):
  _hf_model("tanh").save_pretrained(tmp_path)
  cfg, params = loader.read(str(tmp_path), target="encoder")
  assert set(params) == {"embeddings", "encoder", "pooler"}


def _state(shape="tanh"):
  hf = _hf_model(shape)
  return {k: v.numpy() for k, v in hf.state_dict().items()}, bert_formats.config_from_hf(SHAPES[shape])


def test_mismatches_are_reported_by_name():
  state, cfg = _state()
  state = formats.canonical_names(state)
  broken = dict(state)
  del broken["encoder.layer.1.output.dense.weight"]
  broken["encoder.layer.7.extra.weight"] = np.zeros(3)
  with pytest.raises(formats.CheckpointMismatchError) as e:
    bert_formats.canonical_to_params(broken, cfg)
  assert "missing tensors (1): encoder.layer.1.output.dense.weight" in str(e.value)
  assert "unused tensors (1): encoder.layer.7.extra.weight" in str(e.value)
  wrong = dict(state)
  wrong["pooler.dense.weight"] = np.zeros((64, 65), np.float32)
  with pytest.raises(formats.CheckpointMismatchError, match="pooler/kernel: got \\(65, 64\\), expected \\(64, 64\\)"):
    bert_formats.canonical_to_params(wrong, cfg)
  untied = dict(state)
  untied["cls.predictions.decoder.weight"] = state["embeddings.word_embeddings.weight"] + 1
  with pytest.raises(formats.CheckpointMismatchError, match="ties the MLM output projection"):
    bert_formats.canonical_to_params(untied, cfg)
  # A config that disagrees with the tensors (e.g. a wrong vocab size).
  with pytest.raises(formats.CheckpointMismatchError, match="word_embeddings"):
    bert_formats.canonical_to_params(state, cfg.replace(vocab_size=100))


def test_unknown_path_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a checkpoint bert_jax can read"):
    loader.read(str(tmp_path))


def _write_tf_checkpoint(path, state):
  """Writes `state` under Google's variable names, with Adam slots, via SaveV2."""
  import tensorflow as tf
  names, tensors = [], []
  for hf_name, value in state.items():
    name = hf_name
    if name.startswith("cls.predictions.decoder"):
      continue
    is_linear = name.endswith(".weight") and "embeddings" not in name and "LayerNorm" not in name
    name = name.replace("encoder.layer.", "encoder/layer_")
    name = name.replace(".", "/")
    if "LayerNorm" in name:
      name = name.replace("/weight", "/gamma").replace("/bias", "/beta")
    elif name == "cls/seq_relationship/weight":
      name, is_linear = "cls/seq_relationship/output_weights", False
    elif name == "cls/seq_relationship/bias":
      name = "cls/seq_relationship/output_bias"
    elif name == "cls/predictions/bias":
      name = "cls/predictions/output_bias"
    elif "_embeddings/weight" in name:
      name = name[:-len("/weight")]
    elif is_linear:
      name = name.replace("/weight", "/kernel")
      value = value.T
    if not name.startswith("cls/"):
      name = "bert/" + name
    for suffix in ("", "/adam_m", "/adam_v"):
      names.append(name + suffix)
      tensors.append(tf.constant(np.ascontiguousarray(value)))
  names.append("global_step")
  tensors.append(tf.constant(np.int64(1000)))
  tf.raw_ops.SaveV2(prefix=str(path), tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=tensors)
  return names


def test_google_tf_checkpoint_import(tmp_path):
  hf = _hf_model("odd")
  state = {k: v.numpy() for k, v in hf.state_dict().items() if "position_ids" not in k and "token_type_ids" not in k}
  canonical = formats.canonical_names(state)
  names = _write_tf_checkpoint(tmp_path / "bert_model.ckpt", canonical)
  for expected in ("bert/embeddings/word_embeddings", "bert/encoder/layer_0/attention/self/query/kernel",
                   "bert/encoder/layer_1/output/LayerNorm/gamma", "cls/predictions/transform/dense/kernel",
                   "cls/predictions/output_bias", "cls/seq_relationship/output_weights",
                   "bert/pooler/dense/kernel", "bert/encoder/layer_0/attention/output/dense/kernel"):
    assert expected in names
  google_config = {k: v for k, v in SHAPES["odd"].items()}
  google_config.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
  with open(tmp_path / "bert_config.json", "w") as f:
    json.dump(google_config, f)
  cfg, params = loader.read(str(tmp_path / "bert_model.ckpt"))
  # Google's code implements "gelu" with the tanh approximation.
  assert cfg.hidden_act == "gelu_tanh"
  expected = bert_formats.canonical_to_params(canonical, cfg)
  _assert_trees_equal(params, expected)
  # The directory works as well as the prefix.
  cfg2, params2 = loader.read(str(tmp_path))
  _assert_trees_equal(params2, expected)


def _hub_vocab(directory, size):
  """vocab.txt + tokenizer_config.json of `size` entries, as the Hub ships a BERT's."""
  words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "."]
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  tokens += [f"##x{i}" for i in range(size - len(tokens))]
  (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
  (directory / "tokenizer_config.json").write_text(
      '{"tokenizer_class": "BertTokenizer", "do_lower_case": true}')


def test_convert_cli(tmp_path, capsys):
  _hf_model("tanh").save_pretrained(tmp_path / "hf")
  _hub_vocab(tmp_path / "hf", 99)
  convert.main([f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'ours'}"])
  assert os.path.exists(tmp_path / "ours" / formats.NATIVE_PARAMS)
  convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'back'}", "--to=huggingface"])
  assert "parameters" in capsys.readouterr().out
  transformers.BertForPreTraining.from_pretrained(tmp_path / "back")


def test_a_huggingface_export_is_a_complete_model_directory(tmp_path, capsys):
  """Before: convert --to=huggingface wrote no vocab.txt / tokenizer files, so the export
  loaded in BertForPreTraining but not in AutoTokenizer."""
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  _hf_model("tanh").save_pretrained(tmp_path / "hf")
  convert.main([f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'ours'}"])  # no vocab: a warning
  with pytest.raises(SystemExit) as e:
    convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'out'}", "--to=huggingface"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "holds no vocabulary: pass --vocab=PATH" in err, err
  assert not (tmp_path / "out").exists()  # refused before anything was written
  _hub_vocab(tmp_path, 98)
  with pytest.raises(SystemExit):
    convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'out'}", "--to=huggingface",
                  f"--vocab={tmp_path / 'vocab.txt'}"])
  assert "has 98 entries but the model 99" in capsys.readouterr().err
  _hub_vocab(tmp_path, 99)
  convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'out'}", "--to=huggingface",
                f"--vocab={tmp_path / 'vocab.txt'}"])
  transformers.BertForPreTraining.from_pretrained(tmp_path / "out")
  reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  ours = Tokenizer.from_path(str(tmp_path / "out"))
  text = "The cat sat on a mat. A dog ran."
  assert reference(text)["input_ids"] == [ours.cls_id] + ours.encode(text) + [ours.sep_id]
  assert len(reference) == 99
  # A HuggingFace directory's own tokenizer files travel with it, without --vocab.
  _hub_vocab(tmp_path / "hf", 99)
  convert.main([f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'again'}", "--to=huggingface"])
  assert (tmp_path / "again" / "tokenizer_config.json").read_text() == (
      tmp_path / "hf" / "tokenizer_config.json").read_text()
  transformers.AutoTokenizer.from_pretrained(tmp_path / "again")


@pytest.mark.parametrize("scanned", [pytest.param(False, marks=pytest.mark.slow), True])
def test_config_from_params_reads_every_size_from_the_shapes(scanned):
  """Checkpoints written before runs recorded their BertConfig: the sizes come from the
  parameters (any heads, scanned or not), the other fields from the base config."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  cfg = model_lib.BertConfig(vocab_size=37, hidden_size=24, num_layers=3, num_heads=3,
                             intermediate_size=40, max_position_embeddings=20, type_vocab_size=3,
                             hidden_act="gelu")
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, ids, ids, ids))["params"]
  if scanned:
    params = loader.to_layout(params, True)
  base = model_lib.BertConfig.from_preset("base", hidden_act="gelu")
  assert loader.config_from_params(params, base) == cfg
  assert loader.config_from_params(params["bert"], base) == cfg


@pytest.fixture(scope="module")
def trained_vocabs(tmp_path_factory):
  """A WordPiece, a SentencePiece and a byte-level BPE vocabulary trained here
  (input_pipeline.vocab)."""
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("vocabs")
  (root / "train.txt").write_text("\n\n".join(corpus.iter_texts("default", max_chars=200_000)))
  for kind in ("wordpiece", "sentencepiece", "bpe"):
    vocab_lib.train_vocab(str(root / "train.txt"), str(root / kind), vocab_size=800, kind=kind,
                          lowercase=True)
  return root


def _tiny_hf(family, tok):
  common = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=48)
  if family == "bert":
    return transformers.BertForPreTraining(transformers.BertConfig(**common))
  ids = dict(pad_token_id=tok.pad_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id,
             mask_token_id=tok.mask_id)
  if family == "modernbert":
    return transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        cls_token_id=tok.cls_id, sep_token_id=tok.sep_id, **ids, **common))
  return transformers.EuroBertForMaskedLM(transformers.EuroBertConfig(
      num_key_value_heads=1, **ids, **common))


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece", "bpe"])
@pytest.mark.parametrize("family", ["bert", "modernbert", "eurobert"])
def test_every_export_loads_in_autotokenizer_with_our_ids(tmp_path, trained_vocabs, family, kind):
  """A ModernBERT export of a WordPiece or SentencePiece vocabulary did not load in
  AutoTokenizer ("Couldn't instantiate the backend tokenizer"), and a BERT export of a
  SentencePiece one loaded as a BertTokenizer giving [UNK] for every word (issue 35 item 4):
  every export now carries a tokenizer.json; the ids are ours, singles and pairs."""
  from input_pipeline import corpus  # pylint: disable=g-import-not-at-top
  from input_pipeline import features  # pylint: disable=g-import-not-at-top
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  from tests.test_tokenizer import HARD_TEXT  # pylint: disable=g-import-not-at-top
  vocab = str(trained_vocabs / kind)
  ours = Tokenizer.from_path(vocab)
  _tiny_hf(family, ours).save_pretrained(tmp_path / "hf")
  convert.main([f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'out'}", "--to=huggingface",
                f"--vocab={vocab}"])
  ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  assert (ref.cls_token_id, ref.sep_token_id, ref.mask_token_id, ref.pad_token_id) == (
      ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id)
  texts = list(corpus.iter_texts("default", max_chars=60_000))[::3] + HARD_TEXT
  for text, ids in zip(texts, ours.encode_batch(texts)):
    assert ref(text)["input_ids"] == features.encode_pair(ours, ids)[0], text
  a, b = texts[0], texts[1]
  assert ref(a, b)["input_ids"] == features.encode_pair(ours, ours.encode(a), ours.encode(b))[0]
  again = Tokenizer.from_path(str(tmp_path / "out"))  # ours reads its own file, not the json
  assert again.kind == ours.kind and again.encode_batch(texts) == ours.encode_batch(texts)


# ----------------------------------------------------------------------------
# Every head the checkpoint has is exported (issue 56 item 4).

HEAD_CLASSES = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification",
                "span": "ForQuestionAnswering", "choice": "ForMultipleChoice"}
TASK_OF = {"sequence": "glue", "token": "conll", "span": "squad", "choice": "swag"}
_TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=48, max_position_embeddings=40)


def _tiny_task_hf(tmp_path, family, kind):
  """(directory, model): transformers' `kind` head of a tiny `family` model, random weights."""
  from tests import hf_parity  # pylint: disable=g-import-not-at-top
  ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
  config, stem = {
      "bert": lambda: (transformers.BertConfig(**_TINY), "Bert"),
      "roberta": lambda: (transformers.RobertaConfig(**{**_TINY, "max_position_embeddings": 42},
                                                     pad_token_id=1), "Roberta"),
      "electra": lambda: (transformers.ElectraConfig(embedding_size=16, **_TINY), "Electra"),
      "deberta-v2": lambda: (transformers.DebertaV2Config(
          relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
          norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
          max_relative_positions=-1, pooler_hidden_size=32, **_TINY), "DebertaV2"),
      "modernbert": lambda: (transformers.ModernBertConfig(
          cls_token_id=2, sep_token_id=3, mask_token_id=4, **ids, **_TINY), "ModernBert"),
      "eurobert": lambda: (transformers.EuroBertConfig(num_key_value_heads=1, mask_token_id=4,
                                                       **ids, **_TINY), "EuroBert"),
  }[family]()
  config.num_labels = 2 if kind == "span" else 3  # (start and end)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  return hf_parity.hf_dir(tmp_path, getattr(transformers, stem + HEAD_CLASSES[kind]), config,
                          lambda name: "norm" in name.lower(), seed=1)


def _same_logits(a, b, kind):
  """The two transformers models give the same outputs (the head's, every position)."""
  from tests import hf_parity  # pylint: disable=g-import-not-at-top
  ids, mask = hf_parity.padded_inputs(0, 2, (0, 5), 99, 12, first_id=2, pad_id=0)
  if kind == "choice":  # [batch, choices, length]
    ids, mask = np.stack([ids, ids[::-1]], 1), np.stack([mask, mask[::-1]], 1)
  with torch.no_grad():
    outs = [m.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)) for m in (a, b)]
  names = ("start_logits", "end_logits") if kind == "span" else ("logits",)
  for name in names:
    np.testing.assert_allclose(getattr(outs[0], name).numpy(), getattr(outs[1], name).numpy(),
                               atol=1e-6, err_msg=name)


def _loads_whole(path):
  """transformers' class that config.json names, loaded from `path` with no weight missing
  (re-initialised) or unexpected."""
  arch = json.loads((path / "config.json").read_text())["architectures"][0]
  model, info = getattr(transformers, arch).from_pretrained(
      path, output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], (arch, info)
  return arch, model


@pytest.mark.parametrize("kind", list(HEAD_CLASSES))
@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "deberta-v2", "modernbert",
                                    "eurobert"])
def test_a_task_head_survives_the_round_trip_through_bert_jax(tmp_path, family, kind):
  """HuggingFace ...For<Task> -> bert_jax -> HuggingFace with the default --target, and the
  bert_jax export as a fine-tuning run's best/ (its record naming the task) with --target=all:
  the same transformers class, no weight re-initialised, the same logits. Before: BERT's
  classifier was dropped (BertForPreTraining/BertModel written), and every other family wrote
  any task head as ...ForSequenceClassification."""
  from bert_jax import best_dir  # pylint: disable=g-import-not-at-top
  if family == "eurobert" and kind in ("span", "choice"):
    pytest.skip("transformers has no EuroBert class for this head")
  path, hf = _tiny_task_hf(tmp_path, family, kind)
  _hub_vocab(tmp_path, 99)
  vocab = f"--vocab={tmp_path / 'vocab.txt'}"
  convert.main([f"--input={path}", f"--output={tmp_path / 'ours'}", vocab])
  convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'back'}",
                "--to=huggingface", vocab])
  arch, back = _loads_whole(tmp_path / "back")
  assert arch == type(hf).__name__
  _same_logits(hf, back, kind)
  formats.save_native(str(tmp_path / "best"), *loader.read(str(path), "all"))
  best_dir.mark(tmp_path / "best", ["a", "b", "c"], {"task": TASK_OF[kind]})
  convert.main([f"--input={tmp_path / 'best'}", f"--output={tmp_path / 'exported'}",
                "--to=huggingface", "--target=all", vocab])
  arch, exported = _loads_whole(tmp_path / "exported")
  assert arch == type(hf).__name__
  _same_logits(hf, exported, kind)


def _perturbed(params, seed=0):
  """Every weight moved off its initial value, so a mapping mistake cannot hide."""
  import jax  # pylint: disable=g-import-not-at-top
  leaves, tree = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(
      tree, [np.asarray(x) + rng.normal(0, 0.1, np.shape(x)).astype(np.float32) for x in leaves])


def _fine_tuned_best(tmp_path, cfg, record):
  """(head module, its params, its inputs): a fine-tuning run's best/ at tmp_path/best of the
  task `record` names (random weights), and a vocabulary of 99 entries at tmp_path."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import best_dir, tasks  # pylint: disable=g-import-not-at-top
  from tests import hf_parity  # pylint: disable=g-import-not-at-top
  head = tasks.TASKS[record["task"]].head(cfg, record, ["a", "b", "c"])
  ids, mask = hf_parity.padded_inputs(0, 2, (0, 5), 99, 12, first_id=2, pad_id=0)
  if record["task"] == "swag":  # [batch, choices, length]
    ids, mask = np.stack([ids, ids[::-1]], 1), np.stack([mask, mask[::-1]], 1)
  args = (ids, np.zeros_like(ids), mask)
  params = _perturbed(nn.unbox(head.init(jax.random.key(0), *args))["params"])
  formats.save_native(str(tmp_path / "best"), cfg, params)
  best_dir.mark(tmp_path / "best", ["a", "b", "c"], record)
  _hub_vocab(tmp_path, 99)
  return head, params, args


TINY_BERT = model_lib.BertConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=2,
                                 intermediate_size=48, max_position_embeddings=40)


@pytest.mark.parametrize("kind", list(HEAD_CLASSES))
def test_a_fine_tuned_bert_exports_with_its_head(tmp_path, kind):
  """A BERT fine-tuning run's best/ exported with --target=all (and with the default target)
  was written as BertModel without its classifier: it is now transformers' class of its
  task, every weight loaded, with our logits."""
  head, params, args = _fine_tuned_best(tmp_path, TINY_BERT, {"task": TASK_OF[kind]})
  ours = head.apply({"params": params}, *args)
  ids, _, mask = args
  for target in (["--target=all"], []):
    out = tmp_path / f"hf{len(target)}"
    convert.main([f"--input={tmp_path / 'best'}", f"--output={out}", "--to=huggingface",
                  f"--vocab={tmp_path / 'vocab.txt'}"] + target)
    arch, back = _loads_whole(out)
    assert arch == "Bert" + HEAD_CLASSES[kind]
    with torch.no_grad():
      theirs = back.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if kind == "span":
      got, want = np.stack(ours, -1), np.stack([theirs.start_logits, theirs.end_logits], -1)
    else:
      got, want = np.asarray(ours), theirs.logits.numpy()
    real = mask.astype(bool) if kind in ("token", "span") else slice(None)
    assert np.abs(got[real] - want[real]).max() <= 1e-5, kind


def test_an_encoder_export_without_a_pooler_says_transformers_makes_one(tmp_path, caplog):
  """A pooler-less tree (here BertForMaskedLM's) exported with --target=encoder is written as
  BertModel, whose pooler transformers then initialises at random: said in one warning naming
  the way to load it without one; a tree with its pooler exports without the warning."""
  import logging as py_logging  # pylint: disable=g-import-not-at-top
  _hf_model("tanh", cls=transformers.BertForMaskedLM).save_pretrained(tmp_path / "mlm")
  _hf_model("tanh").save_pretrained(tmp_path / "pre")
  for name in ("mlm", "pre"):
    _hub_vocab(tmp_path / name, 99)
    caplog.clear()
    with caplog.at_level(py_logging.WARNING):
      convert.main([f"--input={tmp_path / name}", f"--output={tmp_path / (name + '_out')}",
                    "--to=huggingface", "--target=encoder"])
    said = [r.getMessage() for r in caplog.records if "pooler" in r.getMessage()]
    config = json.loads((tmp_path / (name + "_out") / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    if name == "pre":
      assert not said, said
      continue
    assert len(said) == 1 and "add_pooling_layer=False" in said[0], said
    transformers.BertModel.from_pretrained(tmp_path / "mlm_out", add_pooling_layer=False)


def test_an_export_that_does_not_record_its_head_kind_asks_for_it(tmp_path, capsys):
  """An export of a fine-tuned head written before kinds were recorded (no task_head in its
  metadata, no fine-tuning record beside it) went out as ...ForSequenceClassification
  whatever its task: now one line asking for --task_head, exit 2, nothing written; with it,
  transformers' class of that kind with our logits; a --task_head that contradicts a
  recorded kind, or given for a tree without a head, is refused too."""
  head, params, args = _fine_tuned_best(tmp_path, TINY_BERT, {"task": "conll"})
  old = tmp_path / "old"
  formats.save_native(str(old), TINY_BERT, params)  # no task_head: the old exports' layout
  base = [f"--input={old}", "--to=huggingface", f"--vocab={tmp_path / 'vocab.txt'}"]
  with pytest.raises(SystemExit) as e:
    convert.main(base + [f"--output={tmp_path / 'out'}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert "does not record the kind of its fine-tuned head" in err and "--task_head=" in err, err
  assert not (tmp_path / "out").exists()
  convert.main(base + [f"--output={tmp_path / 'out'}", "--task_head=token"])
  arch, back = _loads_whole(tmp_path / "out")
  assert arch == "BertForTokenClassification"
  ids, _, mask = args
  with torch.no_grad():
    theirs = back.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  real = mask.astype(bool)
  assert np.abs(np.asarray(head.apply({"params": params}, *args))[real]
                - theirs.numpy()[real]).max() <= 1e-5
  for given, flags in ((tmp_path / "best", ["--task_head=span"]),
                       (tmp_path / "best", ["--task_head=span", "--target=encoder"])):
    with pytest.raises(SystemExit) as e:
      convert.main([f"--input={given}", "--to=huggingface", f"--vocab={tmp_path / 'vocab.txt'}",
                    f"--output={tmp_path / 'no'}"] + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--task_head=span" in err, err
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("case", ["feature_based", "eurobert_span"])
def test_a_head_transformers_has_no_class_for_is_refused(tmp_path, capsys, case):
  """A feature-based head (concatenated layers) or a span head of EuroBERT (transformers has
  no EuroBertForQuestionAnswering) is one line, exit 2, nothing written; --to=bert_jax keeps
  it."""
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  if case == "feature_based":
    cfg, record = TINY_BERT, {"task": "glue", "features": "concat_last4"}
    cfg = cfg.replace(num_layers=4)
  else:
    cfg = families.get("eurobert").from_fields({"preset": "eurobert-tiny", "num_layers": 1}, 99)
    record = {"task": "squad"}
  _fine_tuned_best(tmp_path, cfg, record)
  with pytest.raises(SystemExit) as e:
    convert.main([f"--input={tmp_path / 'best'}", f"--output={tmp_path / 'out'}",
                  "--to=huggingface", f"--vocab={tmp_path / 'vocab.txt'}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert ("feature-based" if case == "feature_based" else "no eurobert class for a span") in err
  assert "--target=encoder" in err and not (tmp_path / "out").exists()
  convert.main([f"--input={tmp_path / 'best'}", f"--output={tmp_path / 'native'}"])
  assert "classifier" in loader.read(str(tmp_path / "native"), "all")[1]


# ----------------------------------------------------------------------------
# The output directory (issue 56 item 7).

def _files(directory):
  return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_a_non_empty_output_is_refused_unless_told_to_replace_it(tmp_path, capsys):
  """convert into a directory holding another model wrote beside it (two models' files, one
  tokenizer.json overwritten): a non-empty --output is one line, exit 2, nothing touched;
  --overwrite replaces it whole (no file of the old model left), as a fresh export."""
  for name, seed in (("a", 0), ("b", 1)):
    _hf_model("tanh", seed=seed).save_pretrained(tmp_path / name)
    _hub_vocab(tmp_path / name, 99)
  convert.main([f"--input={tmp_path / 'a'}", f"--output={tmp_path / 'out'}", "--to=huggingface"])
  (tmp_path / "out" / "README.md").write_text("model a")
  before = {f: (tmp_path / "out" / f).read_bytes() for f in _files(tmp_path / "out")}
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    convert.main([f"--input={tmp_path / 'b'}", f"--output={tmp_path / 'out'}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert "is not empty" in err and "--overwrite" in err and "config.json" in err, err
  assert {f: (tmp_path / "out" / f).read_bytes() for f in _files(tmp_path / "out")} == before
  convert.main([f"--input={tmp_path / 'b'}", f"--output={tmp_path / 'out'}", "--overwrite"])
  convert.main([f"--input={tmp_path / 'b'}", f"--output={tmp_path / 'fresh'}"])
  assert _files(tmp_path / "out") == _files(tmp_path / "fresh")  # no README.md, config.json ...
  _assert_trees_equal(loader.read(str(tmp_path / "out"))[1], loader.read(str(tmp_path / "b"))[1])
  (tmp_path / "empty").mkdir()  # an empty directory needs no flag
  convert.main([f"--input={tmp_path / 'b'}", f"--output={tmp_path / 'empty'}"])


@pytest.mark.parametrize("case", ["input", "inside_input", "vocab_inside", "not_a_model", "file"])
def test_overwrite_never_deletes_what_is_not_an_old_export(tmp_path, capsys, case):
  """--overwrite refuses, in one line and before deleting anything, an --output that is the
  input, lies inside it, holds the --vocab, holds no model (e.g. a home directory) or is a
  file."""
  _hf_model("tanh").save_pretrained(tmp_path / "hf")
  _hub_vocab(tmp_path / "hf", 99)
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "notes.txt").write_text("mine")
  (tmp_path / "f.txt").write_text("mine")
  out, extra = {"input": ("hf", []), "inside_input": ("hf", []), "not_a_model": ("notes", []),
                "vocab_inside": ("hf", []), "file": ("f.txt", [])}[case]
  inp = tmp_path / "hf"
  if case == "inside_input":
    inp, out = tmp_path, "hf"
  if case == "vocab_inside":
    convert.main([f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'ours'}"])
    inp, extra = tmp_path / "ours", [f"--vocab={tmp_path / 'hf' / 'vocab.txt'}"]
  before = _files(tmp_path)
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    convert.main([f"--input={inp}", f"--output={tmp_path / out}", "--overwrite"] + extra)
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert _files(tmp_path) == before


# ----------------------------------------------------------------------------
# Google TF checkpoints on the export path (issue 56 item 10).

def _google_dir(directory):
  """A Google release as it ships: bert_model.ckpt.* + bert_config.json + vocab.txt."""
  directory.mkdir()
  state = {k: v.numpy() for k, v in _hf_model("tanh").state_dict().items()
           if "position_ids" not in k and "token_type_ids" not in k}
  _write_tf_checkpoint(directory / "bert_model.ckpt", formats.canonical_names(state))
  (directory / "bert_config.json").write_text(json.dumps(
      {**SHAPES["tanh"], "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}))
  _hub_vocab(directory, 99)
  (directory / "tokenizer_config.json").unlink()
  return directory / "bert_model.ckpt"


def test_a_google_checkpoint_given_by_its_prefix_exports_with_its_vocabulary(tmp_path):
  """--input=.../bert_model.ckpt (the documented form) found no vocab.txt beside it (the
  directory form did): a HuggingFace export was refused, a bert_jax one held none."""
  prefix = _google_dir(tmp_path / "google")
  for to in ("huggingface", "bert_jax"):
    convert.main([f"--input={prefix}", f"--output={tmp_path / to}", f"--to={to}"])
    assert (tmp_path / to / "vocab.txt").read_text() == (tmp_path / "google" / "vocab.txt").read_text()
  transformers.AutoTokenizer.from_pretrained(tmp_path / "huggingface")
  transformers.BertForPreTraining.from_pretrained(tmp_path / "huggingface")


def _one_line(capsys, argv: list[str]) -> str:
  """convert's stderr for `argv`, which it must refuse in one line, exit 2."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    convert.main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  return err


@pytest.mark.parametrize("damage", ["truncated_index", "garbage_index", "truncated_data"])
def test_a_damaged_google_checkpoint_is_one_line(tmp_path, capsys, damage):
  """A damaged bert_model.ckpt.index (or its data file) was a TensorFlow traceback: one line
  naming the file, exit 2."""
  prefix = _google_dir(tmp_path / "google")
  name = "bert_model.ckpt.index" if "index" in damage else "bert_model.ckpt.data-00000-of-00001"
  f = tmp_path / "google" / name
  data = f.read_bytes()
  f.write_bytes(data[:len(data) // 2] if damage.startswith("truncated") else b"\x17" * len(data))
  for given in (prefix, tmp_path / "google"):
    err = _one_line(capsys, [f"--input={given}", f"--output={tmp_path / 'out'}"])
    assert "is truncated or corrupt" in err and str(tmp_path / "google" / "bert_model.ckpt") in err
  assert not (tmp_path / "out").exists()


def test_a_google_checkpoint_without_tensorflow_is_one_line(tmp_path, capsys, monkeypatch):
  """On an image without TensorFlow, reading a Google TF checkpoint was an ImportError
  traceback: one line saying TensorFlow is needed for that checkpoint and how to install it,
  exit 2 (TensorFlow's absence simulated)."""
  import sys  # pylint: disable=g-import-not-at-top
  prefix = _google_dir(tmp_path / "google")
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` raises ImportError
  for given in (prefix, tmp_path / "google"):
    err = _one_line(capsys, [f"--input={given}", f"--output={tmp_path / 'out'}"])
    assert f"TensorFlow is needed for the Google TF checkpoint {tmp_path / 'google'}" in err, err
    assert "pip install" in err
