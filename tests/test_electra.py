"""ELECTRA (bert_jax/models/electra.py) against transformers in float32, on HuggingFace directories
built here with random weights: what only ELECTRA has (the discriminator, ElectraForPreTraining;
its generator's checkpoint names and presets). What every family shares (hidden states, the
masked-LM logits, task heads, exports, fine-tuning steps) is tests/test_conformance.py's."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax import loader
from bert_jax.models import electra

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests import hf_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

V, L = 96, 20


def _hf_dir(tmp_path, arch, embedding_size=16, hidden_size=32, seed=0, **kw):
  config = transformers.ElectraConfig(**{**dict(
      vocab_size=V, embedding_size=embedding_size, hidden_size=hidden_size,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=L, attn_implementation="eager"), **kw})
  return hf_parity.hf_dir(tmp_path, getattr(transformers, "Electra" + arch), config,
                          lambda name: "LayerNorm" in name, seed)


def _inputs(seed=0, batch=3, pad=(0, 4, 9)):
  return hf_parity.padded_inputs(seed, batch, pad, V, L, first_id=2, pad_id=0)


def test_discriminator_logits_match_transformers(tmp_path):
  path, hf = _hf_dir(tmp_path, "ForPreTraining", 16)
  cfg, params = loader.read(path)
  assert "discriminator_prediction" in params and "transform" not in params
  ids, mask = _inputs(1)
  got = electra.ElectraDiscriminator(cfg).apply({"params": params}, ids, np.zeros_like(ids),
                                                mask)
  with torch.no_grad():
    want = hf(input_ids=hf_parity.to_torch(ids), attention_mask=hf_parity.to_torch(mask)).logits
  real = mask.astype(bool)
  assert np.abs(np.asarray(got)[real] - want.numpy()[real]).max() <= 1e-4


def test_presets():
  small = electra.ElectraConfig.from_preset("electra-small")
  assert (small.embedding_dim, small.hidden_size, small.num_layers) == (128, 256, 12)
  gen = electra.config_from_fields({"preset": "electra-base-generator"}, 30522)
  assert (gen.embedding_dim, gen.hidden_size, gen.num_heads) == (768, 256, 4)
  assert electra.config_from_fields({"preset": "large"}).num_layers == 24


@pytest.mark.slow
def test_fine_tunes_from_a_discriminator_and_predicts(tmp_path, capsys):
  """CoLA from an ElectraForPreTraining directory (vocab.txt beside it) through the
  fine-tuning job (the discriminator's head left out, the gelu classifier new), then predict."""
  from tests.test_task_data import make_vocab  # pylint: disable=g-import-not-at-top
  tok = make_vocab(tmp_path, ["the movie was very good great fine bad awful poor plot acting"])
  path, _ = _hf_dir(tmp_path, "ForPreTraining", 16, vocab_size=tok.vocab_size)
  (tmp_path / "vocab.txt").rename(f"{path}/vocab.txt")
  hf_parity.finetune_and_predict(tmp_path, path, capsys)
  cfg, params = loader.read(str(tmp_path / "work" / "best"), "all")
  assert cfg.family == "electra" and "classifier" in params
  assert "discriminator_prediction" not in params


@pytest.mark.slow
def test_the_suite_runs_on_electra(tmp_path):
  """configs/suite.py on an ELECTRA discriminator: CoLA, MRPC (pairs) and STS-B reported."""
  from tests.test_task_data import make_vocab  # pylint: disable=g-import-not-at-top
  tok = make_vocab(tmp_path, ["the movie was very good great fine bad awful poor plot acting"])
  path, _ = _hf_dir(tmp_path, "ForPreTraining", 16, vocab_size=tok.vocab_size,
                    max_position_embeddings=32)
  (tmp_path / "vocab.txt").rename(f"{path}/vocab.txt")
  hf_parity.suite_runs_on(tmp_path, path)


@pytest.mark.parametrize("arch,names", [
    ("ForPreTraining", ("discriminator_predictions.dense.weight",)),
    ("ForMaskedLM", ("generator_predictions.dense.weight", "generator_lm_head.bias"))])
def test_tensors_left_out_are_named_as_the_file_names_them(tmp_path, caplog, arch, names):
  """The encoder of a discriminator or generator leaves its head out: the warning names
  ELECTRA's encoder and the file's tensors, not "a encoder BERT" and BERT's cls.predictions.*
  (issue 56 item 11)."""
  import logging  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, arch)
  caplog.set_level(logging.WARNING)
  loader.read(path, "encoder")
  warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
  assert len(warned) == 1, warned
  assert "the electra encoder" in warned[0] and all(n in warned[0] for n in names), warned
  assert "BERT" not in warned[0] and "cls.predictions" not in warned[0], warned


def test_weights_config_json_does_not_describe_are_refused(tmp_path):
  """1 layer in config.json over a discriminator's 2, or a tensor under `electra.` that
  ELECTRA has not: one line naming the tensors as the file does and what to do; the
  position_ids buffer still reads (issue 56 item 5)."""
  path, _ = _hf_dir(tmp_path, "ForPreTraining")
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "fewer",
                                                    {"num_hidden_layers": 1}))
  assert "unused tensors (16): electra.encoder.layer.1." in message, message
  assert "hold 2 layers where config.json says num_hidden_layers=1" in message, message
  extra = {"electra.extra.weight": np.ones(2, np.float32)}
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "extra", extra=extra))
  assert "unused tensors (1): electra.extra.weight" in message, message
  loader.read(hf_parity.edited_copy(path, tmp_path / "fine", extra={
      "electra.embeddings.position_ids": np.arange(L)[None]}))


@pytest.mark.parametrize("target", [[], ["--target=pretraining"]])
def test_a_discriminator_keeps_its_head_through_bert_jax(tmp_path, target):
  """ElectraForPreTraining -> bert_jax -> HuggingFace wrote ElectraModel (transformers then
  re-initialised discriminator_predictions.*, no warning): the default target and
  'pretraining' keep the replaced-token head; every weight loads, the same logits."""
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from tests.test_convert import _hub_vocab  # pylint: disable=g-import-not-at-top
  path, hf = _hf_dir(tmp_path, "ForPreTraining", 16)
  _hub_vocab(tmp_path, V)
  vocab = f"--vocab={tmp_path / 'vocab.txt'}"
  convert.main([f"--input={path}", f"--output={tmp_path / 'ours'}", vocab] + target)
  convert.main([f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'back'}",
                "--to=huggingface", vocab] + target)
  config = json.loads((tmp_path / "back" / "config.json").read_text())
  assert config["architectures"] == ["ElectraForPreTraining"]
  back, info = transformers.ElectraForPreTraining.from_pretrained(
      tmp_path / "back", output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask = _inputs(3)
  hf_parity.export_matches(hf, back, ids, mask)
