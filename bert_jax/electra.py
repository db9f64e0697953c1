"""ELECTRA (HuggingFace model_type `electra`): BERT's encoder (bert_jax/model.py) whose
embedding tables may be narrower than the hidden size (`embedding_size`, projected by
`embeddings_project`), exact GELU, and a gelu pooler (its sequence classifier's dense layer).
Two kinds of checkpoint: the discriminator (`ElectraForPreTraining`: a per-token
replaced-or-original head, `ElectraDiscriminator` here) and the generator
(`ElectraForMaskedLM`: the masked-LM head, BERT's with the embedding width). This module
holds the config and presets, the discriminator model, the HuggingFace format both ways and
the Family record (bert_jax/families.py).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax import model as model_lib
from input_pipeline import errors
from input_pipeline import fileio

# name -> sizes (the published discriminators and generators); every preset takes DEFAULTS.
PRESETS: dict[str, dict[str, int]] = {
    "electra-small": dict(embedding_size=128, hidden_size=256, num_layers=12, num_heads=4,
                          intermediate_size=1024),
    "electra-base": dict(embedding_size=768, hidden_size=768, num_layers=12, num_heads=12,
                         intermediate_size=3072),
    "electra-large": dict(embedding_size=1024, hidden_size=1024, num_layers=24, num_heads=16,
                          intermediate_size=4096),
    "electra-small-generator": dict(embedding_size=128, hidden_size=256, num_layers=12,
                                    num_heads=4, intermediate_size=1024),
    "electra-base-generator": dict(embedding_size=768, hidden_size=256, num_layers=12,
                                   num_heads=4, intermediate_size=1024),
    "electra-large-generator": dict(embedding_size=1024, hidden_size=256, num_layers=24,
                                    num_heads=4, intermediate_size=1024),
}
DEFAULTS = dict(vocab_size=30522, hidden_act="gelu", pooler_act="gelu")


@dataclasses.dataclass(frozen=True)
class ElectraConfig(model_lib.BertConfig):
  """BertConfig with ELECTRA's defaults and the family's name."""
  family: str = "electra"
  hidden_act: str = "gelu"
  pooler_act: str = "gelu"

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "ElectraConfig":
    if name not in PRESETS:
      raise errors.ConfigError(f"Unknown ELECTRA preset {name!r}; choose one of {list(PRESETS)}.")
    return cls(**{**DEFAULTS, **PRESETS[name], **overrides})


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None) -> ElectraConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  ElectraConfig; `vocab_size` is the vocabulary's unless the fields set one."""
  overrides = {k: v for k, v in fields.items()
               if k not in ("preset", "family") and v is not None}
  if vocab_size is not None:
    overrides.setdefault("vocab_size", vocab_size)
  preset = fields.get("preset") or "base"
  if preset in ("small", "base", "large"):  # the size names of BERT's configs
    preset = f"electra-{preset}"
  return ElectraConfig.from_preset(preset, **overrides)


class ElectraDiscriminator(nn.Module):
  """The encoder and the replaced-token-detection head: a logit per token, [B, L]
  (positive: replaced), as transformers' ElectraForPreTraining."""
  config: ElectraConfig

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    cfg = self.config
    x_BLD, _ = model_lib.BertModel(cfg, add_pooler=False, name="bert")(
        input_ids, segment_ids, input_mask, deterministic)
    x_BLD = model_lib.dense(cfg, cfg.hidden_size, ("embed", None), "discriminator_dense")(x_BLD)
    x_BLD = model_lib.ACTIVATIONS[cfg.hidden_act](x_BLD)
    logits_BL1 = model_lib.dense(cfg, 1, ("embed", None), "discriminator_prediction")(x_BLD)
    return logits_BL1[..., 0].astype(jnp.float32)


# ----------------------------------------------------------------------------
# HuggingFace names <-> BERT's canonical names (bert_jax/formats.py).

_NAMES = (("generator_predictions.dense.", "cls.predictions.transform.dense."),
          ("generator_predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
          ("generator_lm_head.weight", "cls.predictions.decoder.weight"),
          ("generator_lm_head.bias", "cls.predictions.bias"))
_DISCRIMINATOR = {"discriminator_predictions.dense": "discriminator_dense",
                  "discriminator_predictions.dense_prediction": "discriminator_prediction"}


def to_canonical(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  return formats.renamed(state, _NAMES, strip="electra.")


def config_from_hf(hf: Mapping[str, Any]) -> ElectraConfig:
  bert = formats.config_from_hf(hf)
  fields = {f.name: getattr(bert, f.name) for f in dataclasses.fields(model_lib.BertConfig)}
  return ElectraConfig(**{**fields, "embedding_size": hf.get("embedding_size", hf["hidden_size"]),
                          "pooler_act": "gelu"})


def config_to_hf(cfg: ElectraConfig, architecture: str) -> dict[str, Any]:
  return {**formats.config_to_hf(cfg, architecture), "model_type": "electra",
          "embedding_size": cfg.embedding_dim, "summary_type": "first",
          "summary_use_proj": True, "summary_activation": "gelu",
          "summary_last_dropout": 0.1}


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[ElectraConfig, dict]:
  """(config, unrolled params on the host) of a HuggingFace ELECTRA directory: a
  discriminator's head read as `discriminator_dense` / `discriminator_prediction` (it stands
  in for the masked-LM head a generator has), "all" a task head too."""
  cfg = config_from_hf(formats.read_config_json(fileio.path(path) / "config.json"))
  state = to_canonical(formats.read_hf_state(path))
  extra = {}
  if target != "encoder":
    for hf, ours in _DISCRIMINATOR.items():
      if f"{hf}.weight" in state:
        extra[ours] = {"kernel": np.ascontiguousarray(np.asarray(state.pop(f"{hf}.weight")).T),
                       "bias": np.asarray(state.pop(f"{hf}.bias"))}
  head = formats.pop_task_head(state) if target == "all" else {}
  params = formats.canonical_to_params(
      state, cfg, "pretraining" if target == "all" else target,
      require_mlm=require_mlm and not extra and target != "all",
      source=f"HuggingFace checkpoint {path}")
  return cfg, {**params, **extra, **({"classifier": head} if head else {})}


def params_to_hf(params: dict, cfg: ElectraConfig) -> tuple[dict[str, np.ndarray], str]:
  """(transformers' state dict, its class) of what the params hold: ElectraForPreTraining (a
  discriminator), ...ForSequenceClassification (a fine-tuned classifier), ...ForMaskedLM (a
  generator) or ElectraModel."""
  head = params.get("classifier")
  discriminator = "discriminator_prediction" in params
  mlm = formats.heads(params)["mlm"]
  kind = ("ForPreTraining" if discriminator else "ForSequenceClassification" if head is not None
          else "ForMaskedLM" if mlm else "Model")
  state = formats.renamed(formats.params_to_canonical(params, cfg),
                         tuple((b, a) for a, b in _NAMES),
                         add="electra." if kind != "Model" else "")
  for hf, ours in _DISCRIMINATOR.items():
    if discriminator:
      state[f"{hf}.weight"] = np.ascontiguousarray(np.asarray(params[ours]["kernel"]).T)
      state[f"{hf}.bias"] = np.asarray(params[ours]["bias"])
  if head is not None and not discriminator:
    formats.classifier_to_hf(state, head, "electra.pooler.dense")
  for k in [k for k in state if k.startswith(("electra.pooler.", "pooler."))]:
    del state[k]  # (ELECTRA has no pooler: a classifier's dense stands for ours)
  return state, "Electra" + kind


def export_hf(path: str, cfg: ElectraConfig, params: dict, tokenizer: Any = None) -> None:
  """model.safetensors + config.json of params_to_hf (config.json written last)."""
  del tokenizer  # (a WordPiece vocabulary, as BERT's)
  state, architecture = params_to_hf(params, cfg)
  config = {**config_to_hf(cfg, architecture), **formats.label_fields(params)}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config, indent=2))


FAMILIES = {"electra": dataclasses.replace(
    formats.FAMILIES["bert"], name="electra", config=ElectraConfig,
    from_fields=config_from_fields, causal_lm=None, read_hf=read_hf, export_hf=export_hf,
    model_types=("electra",),
    architecture_fields=formats.FAMILIES["bert"].architecture_fields + ("family",
                                                                         "embedding_size"))}
