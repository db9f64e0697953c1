"""The model families, one `Family` record each, found by name (a model config's `family`,
`config.model.family`) or by a HuggingFace checkpoint's `model_type`.

A family owns its model and its checkpoints: a model module (its config class with presets,
encoder with its `hidden_states`, masked-LM model) and a format module beside it (HuggingFace
names both ways) whose `FAMILIES` holds its records. This module knows only where each record lives (MODULES)
and imports that module by name when a family is asked for (as big_vision finds its models/),
so every job, head and reader asks for the family instead of testing types, and a module below
the formats (heads, flops) can ask without importing what lies above it. Adding a family is its
model module, its format module and one line of MODULES.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any, Callable, Mapping

from bert_jax import sharding
from common import errors
from common import fileio

# family name -> the module whose FAMILIES dict holds its record.
MODULES: dict[str, str] = {
    "bert": "bert_jax.models.bert_formats",
    "modernbert": "bert_jax.models.modern_formats",  # ModernBERT, Ettin, mmBERT
    "eurobert": "bert_jax.models.modern_formats",
    "electra": "bert_jax.models.electra",
    "roberta": "bert_jax.models.roberta",
    "xlm-roberta": "bert_jax.models.roberta",
    "deberta-v2": "bert_jax.models.deberta",  # DeBERTa-v3
}


# The parameter layout every family's encoder keeps (loader converts between the two;
# tests/test_families.py checks every family against it; predict and feature-based
# fine-tuning read the layers' outputs through the encoder's `hidden_states`, not by it): the
# layers lie under ENCODER, unrolled as one subtree a layer named UNROLLED_LAYER.format(i),
# i = 0 .. num_layers - 1, or with scan_layers as one subtree SCANNED_LAYERS whose every leaf
# stacks the layers on axis 0. A family that shares one layer between depths (ALBERT) has
# no such subtrees and needs its own layout here first.
ENCODER, UNROLLED_LAYER, SCANNED_LAYERS = "encoder", "layer_{}", "layers"


@dataclasses.dataclass(frozen=True)
class Family:
  """Everything the jobs need of a model family."""
  name: str
  config: type  # its frozen config dataclass: from_dict, from_preset, replace; `.family` == name
  from_fields: Callable[[Mapping[str, Any], int | None], Any]  # config.model fields, vocab size
  # (cfg, add_pooler=, pooled_only=, name=) -> the encoder module; its method hidden_states
  # gives [embeddings, layer 1, ..., layer N] (the last the model's output), each [B, L, D]
  encoder: Callable[..., Any]
  masked_lm: Callable[[Any, bool], Any]  # (cfg, nsp) -> the pre-training model
  # (path, target, require_mlm) -> (cfg, unrolled host params) of a HuggingFace directory
  read_hf: Callable[[str, str, bool], tuple[Any, dict]]
  # a HuggingFace config.json's fields -> its config (no weights read: a job building its
  # model takes from an init_checkpoint what config.model cannot set, registry.model_config)
  config_from_hf: Callable[[Mapping[str, Any]], Any]
  # (path, target, require_mlm) -> the same of a bert_jax export (its tree as saved: read_native)
  read_native: Callable[[str, str, bool], tuple[Any, dict]]
  # (path, cfg, params, tokenizer or None, task_head=): what transformers loads, a fine-tuned
  # `classifier` as the class of its kind (formats.TASK_HEAD_CLASSES); returns the directories
  # written when it writes more than `path` (ELECTRA's generator), else None
  export_hf: Callable[..., list[str] | None]
  model_types: tuple[str, ...]  # HuggingFace config.json model_type values it reads
  architecture_fields: tuple[str, ...]  # fields a checkpoint and config.model must agree on
  dropout: Mapping[str, float | None]  # fine-tuning's dropout fields -> default (None: the model's)
  forward_flops: Callable[..., int]  # (cfg, seq_len, num_predictions, nsp, last_rows)
  # The vocabulary a run of this family trains when it builds one from a corpus and
  # config.build.vocab_kind names none: its published checkpoints' kind (input_pipeline/vocab.py
  # KINDS: wordpiece, sentencepiece, bpe = byte-level BPE).
  vocab_kind: str = "wordpiece"
  # Logical axis name -> mesh axes for the names its modules use (config.logical_axis_rules,
  # when set, replaces it): the shared table unless the family lays its parameters out
  # otherwise.
  sharding_rules: tuple[tuple[str, Any], ...] = sharding.RULES
  padded_vocab: bool = False  # the embedding table may have more rows than the vocabulary
  # The parameters indexed by the vocabulary, as (the end of their path in a pre-training
  # tree, the axis the vocabulary indexes): the word embeddings, the masked-LM output bias
  # (ELECTRA's generator's too), an untied output projection; what config.vocab_transfer
  # rebuilds for another vocabulary (bert_jax/vocab_transfer.py)
  vocab_tensors: tuple[tuple[str, int], ...] = (("embeddings/word_embeddings/embedding", 0),
                                                ("output_bias", 0))
  names_specials: bool = False  # its HuggingFace tokenizer_config.json names the special tokens
  # (the transformers classes holding its masked-LM head, that head's tensors), for messages
  mlm_head: tuple[str, str] = ("a BertForMaskedLM or BertForPreTraining", "cls.predictions.*")
  # transformers' base model class (BertModel, RobertaModel) holds a pooler, which it
  # initialises at random when the weights lack one
  hf_pooler: bool = False
  causal_lm: Callable[[Any], Any] | None = None  # the left-to-right LM (objective ltr), if any
  # (cfg, generator size) -> ELECTRA's generator + discriminator (objective electra), if any
  replaced_token_detection: Callable[[Any, float], Any] | None = None
  # The kinds of fine-tuned head transformers has a class of this family for (export_hf).
  task_heads: tuple[str, ...] = ("sequence", "token", "span", "choice")
  # (sequence length, config.model's fields) -> the config.model fields a pre-training job on
  # GPU sets where the config leaves them unset (None), each measured (e.g. BERT's fused
  # attention in bf16 from 256 tokens on)
  gpu_defaults: Callable[[int, Mapping[str, Any]], Mapping[str, Any]] = lambda length, fields: {}


def preset_sizes(presets: Mapping[str, Mapping[str, Any]], name: str, label: str
                 ) -> dict[str, Any]:
  """A copy of preset `name`'s fields (a ConfigError naming the `label` family's presets
  if there is no such preset)."""
  if name not in presets:
    raise errors.ConfigError(f"Unknown {label} preset {name!r}; choose one of {list(presets)}.")
  return dict(presets[name])


def config_from_fields(config: type, fields: Mapping[str, Any], vocab_size: int | None,
                       prefix: str, sizes: tuple[str, ...], **fixed) -> Any:
  """`config.from_preset` of a config's `model` section (preset_and_overrides), `fixed`
  fields last."""
  preset, overrides = preset_and_overrides(fields, vocab_size, prefix, sizes)
  return config.from_preset(preset, **{**overrides, **fixed})


def preset_and_overrides(fields: Mapping[str, Any], vocab_size: int | None, prefix: str,
                         sizes: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
  """A config's `model` section -> (preset name, the fields that override it) for a family
  whose presets are `{prefix}-{size}`: BERT's size names in `sizes` name the family's
  (base -> roberta-base); None fields keep the preset's; `vocab_size` is the vocabulary's
  unless the fields set one, which must hold the whole vocabulary (a ConfigError)."""
  overrides = {k: v for k, v in fields.items()
               if k not in ("preset", "family") and v is not None}
  if vocab_size is not None:
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] < vocab_size:
      raise errors.ConfigError(f"config.model.vocab_size={overrides['vocab_size']} is smaller "
                               f"than the vocabulary ({vocab_size} entries).")
  preset = fields.get("preset") or "base"
  return (f"{prefix}-{preset}" if preset in sizes else preset), overrides


def names() -> list[str]:
  return sorted(MODULES)


def get(name: str) -> Family:
  """The family called `name` (a ConfigError naming the known ones otherwise)."""
  if name not in MODULES:
    raise errors.ConfigError(f"model family {name!r} is unknown: choose one of "
                             f"{', '.join(names())}.")
  return importlib.import_module(MODULES[name]).FAMILIES[name]


def of(cfg: Any) -> Family:
  """The family of a model config."""
  return get(cfg.family)


def model_types() -> dict[str, str]:
  """HuggingFace model_type -> the family that reads it."""
  return {t: name for name in names() for t in get(name).model_types}


class UnsupportedModelError(errors.UserError, ValueError):
  """A HuggingFace checkpoint of a model type no family reads."""


def of_hf_dir(path: str) -> Family | None:
  """The family of a HuggingFace directory (its config.json's model_type; none: BERT, as
  Google's and early HuggingFace configs name none); None when it holds no config.json. A
  model_type no family reads is an UnsupportedModelError naming it and the supported ones."""
  p = fileio.path(path) / "config.json"
  if not p.exists():
    return None
  try:
    hf = json.loads(p.read_text())
  except (ValueError, UnicodeDecodeError):
    hf = None
  kind = hf.get("model_type", "bert") if isinstance(hf, dict) else "bert"
  table = model_types()
  if kind not in table:
    raise UnsupportedModelError(
        f"{path} is a {kind!r} checkpoint (config.json model_type), which bert_jax does not "
        f"read: the supported model types are {', '.join(sorted(table))}.")
  return get(table[kind])
