"""Every family against transformers in float32, one table row each (families.names(); a
row per option set a family's module must also read), on HuggingFace directories built here
as the Hub ships them with random weights: every hidden state and the masked-LM logits, the
task heads the family's record names (Family.task_heads), exports transformers loads with
every key and that read back bit-identical, and four fine-tuning steps.

Adding a family is a row here; what only one family has (ELECTRA's discriminator, DeBERTa's
relative buckets, ModernBERT's attention kernels and pooling kinds, the tokenizers) stays in
its own test file."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import jax
import numpy as np
import pytest

from bert_jax import families, loader

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests import hf_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_LAYER_NORM = lambda name: "LayerNorm" in name or "layer_norm" in name
_DEBERTA_V3 = dict(relative_attention=True, position_buckets=8, max_relative_positions=-1,
                   position_biased_input=False, share_att_key=True, pos_att_type="p2c|c2p",
                   norm_rel_ebd="layer_norm", type_vocab_size=0)
_DEBERTA_V2 = dict(relative_attention=True, position_buckets=-1, max_relative_positions=16,
                   position_biased_input=True, share_att_key=False, pos_att_type="p2c|c2p",
                   norm_rel_ebd="none", type_vocab_size=2, embedding_size=24)
_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_MODERN = dict(hidden_size=64, num_attention_heads=4, intermediate_size=96,
               max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _deberta_segments(ids: np.ndarray, cfg) -> np.ndarray:
  segments = np.zeros_like(ids)
  segments[:, 20:] = 1 if cfg.type_vocab_size else 0
  return segments


@dataclasses.dataclass(frozen=True)
class Row:
  """One family (or one option set of it) as transformers builds it."""
  family: str
  stem: str  # transformers' class prefix: Bert, Roberta, DebertaV2, ...
  config: dict[str, Any]  # its config class's fields
  vocab: int
  length: int
  first_id: int  # the [CLS] / <s> id every input starts with
  pad_id: int
  pad: tuple[int, ...] = (0, 4, 9)  # each row's trailing padding
  is_norm: Callable[[str], bool] = _LAYER_NORM
  # (ids, model config) -> the segment ids both sides read (transformers' token_type_ids)
  segments: Callable[[np.ndarray, Any], np.ndarray] = lambda ids, cfg: np.zeros_like(ids)
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # of the config read
  exports: tuple[str, ...] = ("ForMaskedLM", "Model", "ForSequenceClassification")
  # four fine-tuning steps: transformers' names -> the export's, the parameter names with no
  # weight decay, and those the export may leave out (tied)
  hf_name: Callable[[str], str] = lambda k: k
  no_decay: Callable[[str], bool] = lambda n: "LayerNorm" in n or n.endswith("bias")
  untouched: frozenset[str] = frozenset()
  dropout_off: dict[str, float] = dataclasses.field(default_factory=lambda: dict(
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

  def hf_config(self, **kw):
    cls = getattr(transformers, self.stem + "Config")
    return cls(**{**dict(vocab_size=self.vocab), **self.config, **kw})

  def hf_dir(self, tmp_path, arch: str, seed: int = 0, **kw):
    return hf_parity.hf_dir(tmp_path, getattr(transformers, self.stem + arch),
                            self.hf_config(**kw), self.is_norm, seed)

  def inputs(self, seed: int = 0, batch: int = 3, pad: tuple[int, ...] | None = None):
    return hf_parity.padded_inputs(seed, batch, self.pad if pad is None else pad, self.vocab,
                                   self.length, self.first_id, self.pad_id)


_ROBERTA = dict(**_SMALL, max_position_embeddings=26, pad_token_id=1, bos_token_id=0,
                eos_token_id=2, type_vocab_size=1, attn_implementation="eager")
ROWS = {
    "bert": Row("bert", "Bert", dict(**_SMALL, max_position_embeddings=20, type_vocab_size=2,
                                     attn_implementation="eager"), 96, 20, 2, 0,
                segments=lambda ids, cfg: np.broadcast_to(
                    (np.arange(ids.shape[1]) >= 12).astype(ids.dtype), ids.shape),
                untouched=frozenset({"bert.embeddings.position_ids"})),
    "roberta": Row("roberta", "Roberta", _ROBERTA, 120, 24, 0, 1, pad=(0, 5, 11),
                   # one token type: a pair's second segment reads it too
                   segments=lambda ids, cfg: np.ones_like(ids),
                   fields=dict(position_offset=2, max_length=24),
                   untouched=frozenset({"roberta.embeddings.position_ids"})),
    "xlm-roberta": Row("xlm-roberta", "XLMRoberta", _ROBERTA, 120, 24, 0, 1, pad=(0, 5, 11),
                       segments=lambda ids, cfg: np.ones_like(ids),
                       fields=dict(position_offset=2, max_length=24),
                       untouched=frozenset({"roberta.embeddings.position_ids"})),
    "electra": Row("electra", "Electra", dict(**_SMALL, embedding_size=16,
                                              max_position_embeddings=20,
                                              attn_implementation="eager"), 96, 20, 2, 0,
                   fields=dict(embedding_dim=16, pooler_act="gelu"),
                   exports=("ForPreTraining", "ForMaskedLM", "Model", "ForSequenceClassification"),
                   untouched=frozenset({"electra.embeddings.position_ids"})),
    "deberta-v2": Row("deberta-v2", "DebertaV2", dict(
        **_SMALL, max_position_embeddings=40, layer_norm_eps=1e-7, pooler_hidden_size=32,
        **_DEBERTA_V3), 96, 40, 1, 0, pad=(0, 4, 19), is_norm=lambda n: "LayerNorm" in n,
                      segments=_deberta_segments),
    "modernbert": Row("modernbert", "ModernBert", dict(
        **_MODERN, num_hidden_layers=4, local_attention=8, cls_token_id=1, sep_token_id=2,
        global_attn_every_n_layers=3, attn_implementation="eager"), 96, 40, 1, 0,
                      pad=(0, 7, 19), is_norm=lambda n: "norm" in n,
                      exports=("ForMaskedLM", "ForSequenceClassification"),
                      hf_name=lambda k: k.removeprefix("model."),
                      no_decay=lambda n: "norm" in n or n.endswith("bias"),
                      untouched=frozenset({"decoder.weight"}), dropout_off={}),
    "eurobert": Row("eurobert", "EuroBert", dict(
        **_MODERN, num_hidden_layers=3, num_key_value_heads=2, mask_token_id=3,
        attn_implementation="eager"), 96, 40, 1, 0, pad=(0, 7, 19), is_norm=lambda n: "norm" in n,
                    exports=("ForMaskedLM", "ForSequenceClassification"),
                    hf_name=lambda k: k.removeprefix("model."),
                    no_decay=lambda n: "norm" in n or n.endswith("bias"),
                    untouched=frozenset({"decoder.weight"}), dropout_off={}),
}
# Option sets of a family that its reader maps otherwise: hidden states and logits only.
VARIANTS = {
    "electra, embeddings as wide as the layers": dataclasses.replace(
        ROWS["electra"], config={**ROWS["electra"].config, "embedding_size": 32},
        fields=dict(embedding_dim=32)),
    "deberta-v2, v2's options": dataclasses.replace(
        ROWS["deberta-v2"], config={**ROWS["deberta-v2"].config, **_DEBERTA_V2}),
}
HEADS = {"sequence": ("ForSequenceClassification", "classify"),
         "token": ("ForTokenClassification", "tag"), "span": ("ForQuestionAnswering", "qa"),
         "choice": ("ForMultipleChoice", "choice")}
_torch = hf_parity.to_torch
# Cases another test already covers in the default tier (BERT's parity in tests/test_convert.py,
# XLM-R's code path RoBERTa's), or new with this table: the slow tier runs them.
_SLOW = {"bert", "xlm-roberta", ("modernbert", "span"), ("modernbert", "choice")}


def _tiered(cases):
  return [pytest.param(*c, marks=pytest.mark.slow) if c[0] in _SLOW or c in _SLOW
          else pytest.param(*c) for c in cases]


def test_every_family_has_a_row():
  assert sorted(ROWS) == sorted(families.names())
  assert all(row.family == name for name, row in ROWS.items())


@pytest.mark.parametrize("name", list(ROWS) + list(VARIANTS))
def test_hidden_states_and_mlm_logits_match_transformers(tmp_path, name):
  row = {**ROWS, **VARIANTS}[name]
  path, hf = row.hf_dir(tmp_path, "ForMaskedLM")
  cfg, params = loader.read(path)
  family = families.of(cfg)
  assert cfg.family == family.name == row.family
  assert {k: getattr(cfg, k) for k in row.fields} == row.fields
  ids, mask = row.inputs()
  segments = row.segments(ids, cfg)
  # transformers reads token types only where the model has more than one
  types = {"token_type_ids": _torch(segments)} if getattr(cfg, "type_vocab_size", 0) > 1 else {}
  with torch.no_grad():
    out = hf(input_ids=_torch(ids), attention_mask=_torch(mask), output_hidden_states=True,
             **types)
  real = mask.astype(bool)
  encoder = family.encoder(cfg, add_pooler=False)
  got = encoder.apply({"params": params["bert"]}, ids, segments, mask,
                      method=encoder.hidden_states)
  assert len(got) == len(out.hidden_states) == cfg.num_layers + 1
  for i, (g, w) in enumerate(zip(got, out.hidden_states, strict=True)):
    assert np.abs(np.asarray(g)[real] - w.numpy()[real]).max() <= 1e-5, i
  positions = np.broadcast_to(np.arange(row.length, dtype=np.int32), ids.shape)
  logits = family.masked_lm(cfg, False).apply(
      {"params": params}, ids, segments, mask, positions)["mlm_logits"]
  got_logits, want_logits = np.asarray(logits)[real], out.logits.numpy()[real]
  assert np.abs(got_logits - want_logits).max() <= 1e-4
  assert (got_logits.argmax(-1) == want_logits.argmax(-1)).all()


@pytest.mark.parametrize("name,kind", _tiered([(n, k) for n in ROWS
                                                for k in families.get(n).task_heads]))
def test_task_head_logits_match_transformers(tmp_path, name, kind):
  row = ROWS[name]
  arch, head = HEADS[kind]
  path, hf = row.hf_dir(tmp_path, arch, num_labels=2 if head == "qa" else 3)
  cfg, params = loader.read(path, "all")
  ids, mask = row.inputs(2)
  if head == "choice":  # [2 questions, 3 choices, L]
    rows = [row.inputs(s) for s in (4, 5)]
    ids, mask = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
  hf_parity.task_head_matches(cfg, params, hf, ids, mask, head)


@pytest.mark.parametrize("name,arch", _tiered([(n, a) for n, row in ROWS.items()
                                                for a in row.exports]))
def test_export_loads_in_transformers_with_every_key_and_reads_back_bit_identical(
    tmp_path, name, arch):
  row = ROWS[name]
  path, hf = row.hf_dir(tmp_path, arch, num_labels=2)
  target = "pretraining" if arch in ("ForMaskedLM", "ForPreTraining") else "all"
  cfg, params = loader.read(path, target, require_mlm=False)
  out = tmp_path / "out"
  families.of(cfg).export_hf(str(out), cfg, params)
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == name and config["architectures"] == [row.stem + arch]
  cfg2, params2 = loader.read(str(out), target, require_mlm=False)
  assert cfg2 == cfg
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  back, info = getattr(transformers, row.stem + arch).from_pretrained(
      out, output_loading_info=True, attn_implementation=row.config.get("attn_implementation"))
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  theirs = back.state_dict()
  for n, a in hf.state_dict().items():
    assert torch.equal(a, theirs[n]), n
  ids, mask = row.inputs(3)
  hf_parity.export_matches(hf, back, ids, mask)


def _exported(tmp_path, cfg) -> Callable[[dict], dict]:
  """params -> the tensors of their export (the family's export_hf, a sequence classifier)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  def state(params):
    out = tmp_path / "steps_export"
    families.of(cfg).export_hf(str(out), cfg, params, task_head="sequence")
    return load_file(out / "model.safetensors")
  return state


@pytest.mark.parametrize("name", _tiered([(n,) for n in ROWS]))
def test_four_finetuning_steps_match_transformers(tmp_path, name):
  row = ROWS[name]
  path, hf = row.hf_dir(tmp_path, "ForSequenceClassification", num_labels=3, **row.dropout_off)
  cfg, params = loader.read(path, "all")
  if row.dropout_off:
    cfg = cfg.replace(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  untouched = hf_parity.four_steps_match(
      hf, cfg, params, lambda seed: row.inputs(seed, batch=4, pad=(0, 3, 9, 0)),
      _exported(tmp_path, cfg), row.no_decay, name=row.hf_name)
  assert untouched <= row.untouched, untouched
