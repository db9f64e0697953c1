"""RoBERTa and XLM-RoBERTa (HuggingFace model_type `roberta`, `xlm-roberta`): BERT's encoder
(bert_jax/models/bert.py) with positions counted from after the padding index (`position_offset`
2), one token type, no next-sentence head and a byte-level BPE (RoBERTa) or SentencePiece
(XLM-R) vocabulary read from the checkpoint's tokenizer.json (pairs as `<s> A </s></s> B
</s>`). This module holds their config and presets, their HuggingFace format both ways and
their Family records (bert_jax/families.py).

Their sequence-classification head is BERT's (the pooler's dense + tanh on the first token,
then the classifier), which is transformers' RobertaClassificationHead (`classifier.dense`,
`classifier.out_proj`) but for the dropout before its dense layer.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax.models import bert as model_lib
from bert_jax.models import bert_formats
from common import errors
from common import fileio

FAMILY_NAMES = ("roberta", "xlm-roberta")
# name -> sizes; every preset also takes DEFAULTS.
PRESETS: dict[str, dict[str, int]] = {
    "roberta-base": dict(vocab_size=50265, hidden_size=768, num_layers=12, num_heads=12,
                         intermediate_size=3072),
    "roberta-large": dict(vocab_size=50265, hidden_size=1024, num_layers=24, num_heads=16,
                          intermediate_size=4096),
    "xlm-roberta-base": dict(vocab_size=250002, hidden_size=768, num_layers=12, num_heads=12,
                             intermediate_size=3072),
    "xlm-roberta-large": dict(vocab_size=250002, hidden_size=1024, num_layers=24, num_heads=16,
                              intermediate_size=4096),
}
DEFAULTS = dict(max_position_embeddings=514, type_vocab_size=1, hidden_act="gelu",
                layer_norm_eps=1e-5, position_offset=2)


@dataclasses.dataclass(frozen=True)
class RobertaConfig(model_lib.BertConfig):
  """BertConfig with RoBERTa's defaults and the family's name (roberta | xlm-roberta)."""
  family: str = "roberta"
  max_position_embeddings: int = 514
  type_vocab_size: int = 1
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-5
  position_offset: int = 2

  def __post_init__(self):
    super().__post_init__()
    if self.family not in FAMILY_NAMES:
      raise errors.ConfigError(f"RobertaConfig family {self.family!r}: choose one of "
                               f"{', '.join(FAMILY_NAMES)}.")

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "RobertaConfig":
    sizes = families.preset_sizes(PRESETS, name, "RoBERTa")
    family = "xlm-roberta" if name.startswith("xlm") else "roberta"
    return cls(**{**DEFAULTS, **sizes, "family": family, **overrides})


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None,
                       family: str = "roberta") -> RobertaConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  RobertaConfig; `vocab_size` is the vocabulary's (it replaces the preset's unless the fields
  set one)."""
  return families.config_from_fields(RobertaConfig, fields, vocab_size, family,
                                     ("base", "large"), family=family)


# ----------------------------------------------------------------------------
# HuggingFace names <-> BERT's canonical names (bert_formats.py).

_NAMES = (("lm_head.dense.", "cls.predictions.transform.dense."),
          ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
          ("lm_head.decoder.", "cls.predictions.decoder."),
          ("lm_head.bias", "cls.predictions.bias"))


def to_canonical(state: Mapping[str, np.ndarray], origin: dict[str, str] | None = None
                 ) -> dict[str, np.ndarray]:
  return formats.renamed(state, _NAMES, strip="roberta.", origin=origin)


def from_canonical(state: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  return formats.renamed(state, tuple((b, a) for a, b in _NAMES), add=prefix)


def config_from_hf(hf: Mapping[str, Any]) -> RobertaConfig:
  bert = bert_formats.config_from_hf({"layer_norm_eps": 1e-5, **hf})
  fields = {f.name: getattr(bert, f.name) for f in dataclasses.fields(model_lib.BertConfig)}
  return RobertaConfig(**{**fields, "family": hf.get("model_type", "roberta"),
                          "position_offset": hf.get("pad_token_id", 1) + 1})


def config_to_hf(cfg: RobertaConfig, architecture: str) -> dict[str, Any]:
  pad = cfg.position_offset - 1
  return {**bert_formats.config_to_hf(cfg, architecture), "model_type": cfg.family,
          "pad_token_id": pad, "bos_token_id": 0, "eos_token_id": 2}


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[RobertaConfig, dict]:
  """(config, unrolled params on the host) of a HuggingFace RoBERTa / XLM-R directory;
  "all" also reads a task head (sequence or token classification, spans, multiple choice)."""
  cfg = config_from_hf(formats.read_config_json(fileio.path(path) / "config.json"))
  origin = {}
  state = to_canonical(formats.read_hf_state(path, origin), origin)
  head = formats.pop_task_head(state) if target == "all" else {}
  params = bert_formats.canonical_to_params(
      state, cfg, "pretraining" if target == "all" else target,
      require_mlm=require_mlm and target != "all", source=f"HuggingFace checkpoint {path}",
      origin=origin)
  return cfg, {**params, "classifier": head} if head else params


# transformers' names of a fine-tuned head, per kind (formats.task_head_to_hf): the
# sequence classifier's dense layer is our pooler.
TASK_HEADS = formats.task_head_names("roberta.pooler.dense",
                                     sequence=("classifier.dense", "classifier.out_proj"))


def params_to_hf(params: dict, cfg: RobertaConfig, task_head: str = "sequence"
                 ) -> tuple[dict[str, np.ndarray], str]:
  """(transformers' state dict, its class) of what the params hold: a fine-tuned classifier
  as the class of its kind `task_head` (formats.TASK_HEAD_CLASSES: ...ForSequenceClassification
  with the pooler as its dense layer, ...), ...ForMaskedLM or ...Model."""
  stem = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[cfg.family]
  head = params.get("classifier")
  mlm = formats.heads(params)["mlm"]
  kind = (formats.TASK_HEAD_CLASSES[task_head] if head is not None
          else "ForMaskedLM" if mlm else "Model")
  state = from_canonical(bert_formats.params_to_canonical(params, cfg),
                         "roberta." if kind != "Model" else "")
  if head is not None:
    formats.task_head_to_hf(state, head, "roberta.pooler.dense", TASK_HEADS[task_head])
  return state, stem + kind


def export_hf(path: str, cfg: RobertaConfig, params: dict, tokenizer: Any = None,
              task_head: str = "sequence") -> None:
  """model.safetensors + config.json of params_to_hf (config.json written last: a directory
  without it is not read as a checkpoint)."""
  del tokenizer  # (RoBERTa's special ids are fixed: config_to_hf)
  state, architecture = params_to_hf(params, cfg, task_head)
  config = {**config_to_hf(cfg, architecture), **formats.label_fields(params)}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config, indent=2))


def _family(name: str) -> families.Family:
  bert = bert_formats.FAMILIES["bert"]
  return dataclasses.replace(
      bert, name=name, config=RobertaConfig,
      from_fields=lambda fields, vocab_size: config_from_fields(fields, vocab_size, name),
      causal_lm=None, read_hf=read_hf, config_from_hf=config_from_hf, export_hf=export_hf,
      model_types=(name,),
      architecture_fields=bert.architecture_fields + ("family", "position_offset"),
      names_specials=True, vocab_kind="bpe" if name == "roberta" else "sentencepiece",
      mlm_head=(("a RobertaForMaskedLM" if name == "roberta" else "an XLMRobertaForMaskedLM"),
                "lm_head.*"))


FAMILIES = {name: _family(name) for name in FAMILY_NAMES}
