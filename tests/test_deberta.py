"""DeBERTa-v3 (bert_jax/models/deberta.py, model_type deberta-v2) against transformers in float32,
on HuggingFace directories built here with random weights: what only DeBERTa has (its relative
position buckets and table rows, presets, tokenizer, refusals). What every family shares
(hidden states and masked-LM logits with v3's and v2's options, task heads, exports, fine-tuning
steps) is tests/test_conformance.py's."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax import families, loader
from bert_jax.models import deberta

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests import hf_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from tests import test_conformance  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

ROW = test_conformance.ROWS["deberta-v2"]  # v3's layout
V, L = ROW.vocab, ROW.length


def _hf_dir(tmp_path, arch, seed=0, **kw):
  return ROW.hf_dir(tmp_path, arch, seed, **kw)


def _inputs(seed=0, batch=3, pad=(0, 4, 19)):
  return hf_parity.padded_inputs(seed, batch, pad, V, L, first_id=1, pad_id=0)


def test_short_inputs_use_fewer_table_rows_and_match_transformers(tmp_path):
  """At L=10 of 40 positions the model projects and scores only the table's rows within
  bucket(9) of the centre (transformers: all 16): the hidden states are still its."""
  path, hf = _hf_dir(tmp_path, "Model")
  cfg, params = loader.read(path, "encoder")
  lo, hi = deberta.relative_rows(cfg, 10)
  assert 0 < lo and hi - lo < 2 * cfg.relative_span
  ids, mask = hf_parity.padded_inputs(7, 3, (0, 2, 5), V, 10, first_id=1, pad_id=0)
  with torch.no_grad():
    want = hf(input_ids=hf_parity.to_torch(ids), attention_mask=hf_parity.to_torch(mask)
              ).last_hidden_state.numpy()
  got = np.asarray(deberta.DebertaModel(cfg, add_pooler=False).apply(
      {"params": params}, ids, np.zeros_like(ids), mask)[0])
  real = mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-5


def test_relative_buckets_match_transformers():
  from transformers.models.deberta_v2 import modeling_deberta_v2 as m  # pylint: disable=g-import-not-at-top
  rel = np.arange(-600, 601, dtype=np.int64)
  want = m.make_log_bucket_position(torch.tensor(rel), 256, 512).long().numpy()
  got = np.asarray(deberta.relative_buckets(rel.astype(np.int32), 256, 512))
  np.testing.assert_array_equal(got, want)


def test_presets():
  base = deberta.DebertaConfig.from_preset("deberta-v3-base")
  assert (base.hidden_size, base.num_layers, base.vocab_size, base.relative_span,
          base.type_vocab_size, base.position_biased_input) == (768, 12, 128100, 256, 0, False)
  assert deberta.config_from_fields({"preset": "large"}, 128100).num_layers == 24
  assert deberta.config_from_fields({"preset": "xsmall"}, 1000).hidden_size == 384


TEXTS = ["The quick brown fox jumps over the lazy dog.", "A cat sat on the mat, and then slept.",
         "Tokenizers split words into pieces; rare words split more.",
         "Numbers like 1234 and symbols & punctuation!", "DeBERTa reads SentencePiece models."] * 20


def _spm_dir(tmp_path, vocab_size=64):
  """A DeBERTa-v3 tokenizer as the Hub ships one: spm.model ([PAD] 0, [CLS] 1, [SEP] 2,
  [UNK] 3; no [MASK]), tokenizer_config.json, config.json naming the model type."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  d = tmp_path / "deberta-tok"
  d.mkdir()
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXTS), model_writer=model, vocab_size=vocab_size,
      pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]",
      unk_id=3, unk_piece="[UNK]", minloglevel=2)
  (d / "spm.model").write_bytes(model.getvalue())
  (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False,
                                                       "vocab_type": "spm"}))
  (d / "config.json").write_text(json.dumps(transformers.DebertaV2Config(
      vocab_size=vocab_size + 8).to_dict()))
  return d


def test_tokenizer_ids_equal_autotokenizers_with_pairs(tmp_path):
  from input_pipeline import features  # pylint: disable=g-import-not-at-top
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  d = _spm_dir(tmp_path)
  ours = Tokenizer.from_path(str(d))
  theirs = transformers.AutoTokenizer.from_pretrained(str(d))
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id) == (1, 2, 0, 3)
  assert ours.mask_id == theirs.mask_token_id == 64 and ours.pair_seps == 1
  for a, b in [("The cat sat.", None), ("A dog ran", "in the park!"), ("mat", "quick foxes")]:
    ids, segments = features.encode_pair(ours, ours.encode(a),
                                         None if b is None else ours.encode(b))
    assert ids == theirs(a, b)["input_ids"], (a, b)
    assert len(segments) == len(ids)
  assert ours.decode([ours.cls_id] + ours.encode("The cat") + [ours.mask_id]).endswith("[MASK]")


def _model_dir(tmp_path):
  """A DeBERTa-v3 directory as the Hub ships one: a DebertaV2ForMaskedLM (random weights,
  72 rows: the 64 pieces, [MASK] and padding) with the tokenizer files beside it."""
  d = _spm_dir(tmp_path)
  path, _ = _hf_dir(tmp_path, "ForMaskedLM", vocab_size=72)
  for f in ("spm.model", "tokenizer_config.json"):
    (tmp_path / path / f).write_bytes((d / f).read_bytes())
  return path


def test_fine_tunes_predicts_and_exports_a_classifier_transformers_loads(tmp_path, capsys):
  """CoLA from a DeBERTa-v3 directory (spm.model beside it) through the fine-tuning job,
  predict --mode=classify on its best/, and convert --target=all --to=huggingface:
  DebertaV2ForSequenceClassification with every key and the same logits, its tokenizer
  AutoTokenizer's ids."""
  path = _model_dir(tmp_path)
  hf_parity.finetune_and_predict(tmp_path, path, capsys)
  hf_parity.exported_classifier_matches(tmp_path, path,
                                        transformers.DebertaV2ForSequenceClassification)


@pytest.mark.slow
def test_the_suite_runs_on_deberta(tmp_path):
  """configs/suite.py on a DeBERTa-v3 checkpoint: CoLA, MRPC (pairs) and STS-B reported."""
  path = _model_dir(tmp_path)
  hf_parity.suite_runs_on(tmp_path, path)


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_pretrains_from_scratch_and_exports(tmp_path):
  """config.model.family=deberta-v2 through the pre-training job (its own vocabulary, no
  token types, relative positions), resumed as a no-op, exported to DebertaV2ForMaskedLM with
  every key."""
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  work = tmp_path / "run"
  args = tu.main_args(work, model__family="deberta-v2", model__preset="base",
                      model__num_layers=2, model__intermediate_size=128, data__nsp=False)
  tu.run(args)
  cfg, params = loader.read(str(work))
  assert (cfg.family, cfg.type_vocab_size, cfg.num_layers, cfg.relative_span) == (
      "deberta-v2", 0, 2, 256)
  assert "Resumed" in tu.run(args).stderr or tu.checkpoint_steps(work) == [6]
  families.of(cfg).export_hf(str(tmp_path / "hf"), cfg, params)
  _, info = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "hf",
                                                              output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_analytic_flops_match_xla_cost_analysis():
  """The pre-training step's model FLOPs (the relative-position terms included) within 10% of
  XLA's count of the compiled step."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from tests import test_train_utils as tu  # pylint: disable=g-import-not-at-top
  from tests.test_train import _batches  # pylint: disable=g-import-not-at-top
  config = tu.tiny_config(**{"model.family": "deberta-v2", "model.preset": "base",
                             "model.num_layers": 2, "model.hidden_size": 256,
                             "model.num_heads": 4, "model.intermediate_size": 1024,
                             "model.vocab_size": 2048, "model.max_position_embeddings": 128,
                             "data.max_seq_length": 128, "data.max_predictions_per_seq": 20,
                             "data.nsp": False})
  trainer = tu.pretraining_trainer(config, devices=jax.devices()[:1])
  with trainer.activate():
    state = trainer.init()
    batch = trainer.to_global(_batches(config, 1)[0])
    compiled = trainer.train_step.lower(state, batch, jax.random.key(0)).compile()
  analytic = trainer.objective.flops(trainer.model, {k: v.shape for k, v in batch.items()})
  xla = flops_lib.xla_flops(compiled)
  assert 0.9 < analytic / xla < 1.1, (analytic, xla)


def test_weights_config_json_does_not_describe_are_refused(tmp_path, caplog):
  """A config.json of 1 layer over weights of 2 built a 1-layer model and an unknown tensor
  was ignored: both are refused in one line naming the tensors as the file does (the first
  few and the count) and what to do, as every family's reader (issue 56 item 5). What
  transformers ignores harmlessly still reads: the position_ids buffer, v3's unused absolute
  positions; the RTD head (mask_predictions.*) is named as left out; our own export reads
  back without a word."""
  import logging  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, "ForMaskedLM")
  for target in ("pretraining", "encoder"):
    message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / target,
                                                      {"num_hidden_layers": 1}), target)
    assert "unused tensors (16): deberta.encoder.layer.1." in message, message
    assert "hold 2 layers where config.json says num_hidden_layers=1" in message, message
  extra = {"deberta.encoder.layer.0.attention.extra.weight": np.ones(2, np.float32)}
  message = hf_parity.refusal(hf_parity.edited_copy(path, tmp_path / "extra", extra=extra))
  assert "unused tensors (1): deberta.encoder.layer.0.attention.extra.weight" in message
  harmless = {"deberta.embeddings.position_ids": np.arange(L)[None],
              "deberta.embeddings.position_embeddings.weight": np.ones((L, 32), np.float32),
              "mask_predictions.dense.weight": np.ones((32, 32), np.float32)}
  caplog.set_level(logging.WARNING)
  cfg, params = loader.read(hf_parity.edited_copy(path, tmp_path / "fine", extra=harmless))
  warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
  assert len(warned) == 1 and "1 tensors that the deberta-v2 pre-training model" in warned[0]
  assert "mask_predictions.dense.weight" in warned[0], warned
  caplog.clear()
  families.of(cfg).export_hf(str(tmp_path / "ours"), cfg, params)
  loader.read(str(tmp_path / "ours"))
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_export_of_other_layers_than_its_config_says_is_refused(tmp_path):
  """A bert_jax export of DeBERTa whose bert_jax_config.json says 1 layer over weights of 2
  built a 1-layer model: refused in one line as by every reader (issue 56 item 5)."""
  from bert_jax import formats  # pylint: disable=g-import-not-at-top
  path, _ = _hf_dir(tmp_path, "ForMaskedLM")
  cfg, params = loader.read(path)
  formats.save_native(str(tmp_path / "ours"), cfg.replace(num_layers=1), params)
  with pytest.raises(formats.CheckpointMismatchError) as e:
    loader.read(str(tmp_path / "ours"), "encoder")
  message = str(e.value)
  assert "\n" not in message and "unused tensors (16): bert/encoder/layer_1/" in message
  assert "hold 2 layers where bert_jax_config.json says num_layers=1" in message, message
