"""ELECTRA (HuggingFace model_type `electra`): BERT's encoder (bert_jax/models/bert.py) whose
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
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax.models import bert as model_lib
from bert_jax.models import bert_formats
from common import errors
from common import fileio

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
    return cls(**{**DEFAULTS, **families.preset_sizes(PRESETS, name, "ELECTRA"), **overrides})


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None) -> ElectraConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  ElectraConfig; `vocab_size` is the vocabulary's unless the fields set one."""
  return families.config_from_fields(ElectraConfig, fields, vocab_size, "electra",
                                     ("small", "base", "large"))


class ElectraDiscriminator(nn.Module):
  """The encoder and the replaced-token-detection head: a logit per token, [B, L]
  (positive: replaced), as transformers' ElectraForPreTraining."""
  config: ElectraConfig

  def setup(self):
    cfg = self.config
    self.bert = model_lib.BertModel(cfg, add_pooler=False)
    self.discriminator_dense = model_lib.dense(cfg, cfg.hidden_size, ("embed", None),
                                               "discriminator_dense")
    self.discriminator_prediction = model_lib.dense(cfg, 1, ("embed", None),
                                                    "discriminator_prediction")

  def discriminate(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
                   position_ids=None, packed_example_ids=None):
    x_BLD, _ = self.bert(input_ids, segment_ids, input_mask, deterministic,
                         position_ids=position_ids, packed_example_ids=packed_example_ids)
    x_BLD = model_lib.ACTIVATIONS[self.config.hidden_act](self.discriminator_dense(x_BLD))
    return self.discriminator_prediction(x_BLD)[..., 0].astype(jnp.float32)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
    return self.discriminate(input_ids, segment_ids, input_mask, deterministic)


def generator_of(cfg: ElectraConfig, size: float) -> ElectraConfig:
  """The generator of a discriminator: `size` times its hidden width, heads and feed-forward
  width (the ELECTRA paper's generator-size multiplier: 1/4 small, 1/3 base and large), the
  same depth and embedding width (the embeddings are shared)."""
  if not 0 < size <= 1:
    raise errors.ConfigError(f"--config.electra.generator_size={size} must be in (0, 1]: the "
                             "generator's width as a fraction of the discriminator's.")
  heads = max(1, round(cfg.num_heads * size))
  hidden = heads * round(cfg.hidden_size * size / heads)  # a whole number of heads
  return cfg.replace(hidden_size=hidden, num_heads=heads, embedding_size=cfg.embedding_dim,
                     intermediate_size=max(1, round(cfg.intermediate_size * size)))


class ElectraPretraining(ElectraDiscriminator):
  """Replaced-token detection (ELECTRA, Clark et al. 2020), what `--config.objective=electra`
  trains: a small masked-LM generator (`generator`, BertForPreTraining(nsp=False)'s tree
  without embeddings: it reads the discriminator's, and its output attends their word
  embeddings) predicts the masked positions; a token is sampled from its distribution at
  each (no gradient flows through the sampling: the "sample" random stream); the
  discriminator (this module's own tree, ElectraDiscriminator's: fine-tuning and export read
  it) sees the text with those samples in and predicts, per token, whether it was replaced
  (a sample equal to the original counts as original). Outputs: "mlm_logits" [B, P, V] (the
  generator's), "disc_logits" and "disc_labels" [B, L] (objectives.electra)."""
  generator_size: float = 0.25

  @property
  def generator_config(self) -> ElectraConfig:
    return generator_of(self.config, self.generator_size)

  def setup(self):
    super().setup()
    self.generator = model_lib.BertForPreTraining(self.generator_config, nsp=False,
                                                  embeddings_of=self.bert)

  def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions, masked_lm_ids,
               masked_lm_weights, deterministic: bool = True, position_ids=None,
               packed_example_ids=None, cls_positions=None) -> dict[str, jax.Array]:
    del cls_positions  # (no pooled output)
    mlm_logits_BPV = self.generator(input_ids, segment_ids, input_mask, masked_lm_positions,
                                    deterministic, position_ids=position_ids,
                                    packed_example_ids=packed_example_ids)["mlm_logits"]
    sampled_BP = jax.random.categorical(self.make_rng("sample"),
                                        jax.lax.stop_gradient(mlm_logits_BPV), axis=-1)
    input_ids = jnp.asarray(input_ids)
    rows_B1 = jnp.arange(input_ids.shape[0])[:, None]
    pos_BP = masked_lm_positions.astype(jnp.int32)
    now_BP = input_ids[rows_B1, pos_BP]
    masked_BP = masked_lm_weights > 0
    original_BL = input_ids.at[rows_B1, pos_BP].set(
        jnp.where(masked_BP, masked_lm_ids.astype(input_ids.dtype), now_BP))
    replaced_BL = input_ids.at[rows_B1, pos_BP].set(
        jnp.where(masked_BP, sampled_BP.astype(input_ids.dtype), now_BP))
    disc_logits_BL = self.discriminate(replaced_BL, segment_ids, input_mask, deterministic,
                                       position_ids, packed_example_ids)
    return {"mlm_logits": mlm_logits_BPV, "disc_logits": disc_logits_BL,
            "disc_labels": (replaced_BL != original_BL).astype(jnp.int32)}


def replaced_token_detection(cfg: ElectraConfig, generator_size: float) -> ElectraPretraining:
  """The model `--config.objective=electra` trains (a bad generator size: a ConfigError now)."""
  generator_of(cfg, generator_size)
  return ElectraPretraining(cfg, generator_size=generator_size)


# ----------------------------------------------------------------------------
# HuggingFace names <-> BERT's canonical names (bert_formats.py).

_NAMES = (("generator_predictions.dense.", "cls.predictions.transform.dense."),
          ("generator_predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
          ("generator_lm_head.weight", "cls.predictions.decoder.weight"),
          ("generator_lm_head.bias", "cls.predictions.bias"))
_DISCRIMINATOR = {"discriminator_predictions.dense": "discriminator_dense",
                  "discriminator_predictions.dense_prediction": "discriminator_prediction"}


# A discriminator's head, which the encoder alone leaves out (named; formats.check_read).
HEADS = formats.HEADS + ("discriminator_predictions.",)
# ElectraForMultipleChoice's summary of [CLS] (a dense layer, gelu) is our pooler.
_READ_ONLY = (("sequence_summary.summary.", "pooler.dense."),)


def to_canonical(state: Mapping[str, np.ndarray], origin: dict[str, str] | None = None
                 ) -> dict[str, np.ndarray]:
  return formats.renamed(state, _NAMES + _READ_ONLY, strip="electra.", origin=origin)


def config_from_hf(hf: Mapping[str, Any]) -> ElectraConfig:
  bert = bert_formats.config_from_hf(hf)
  fields = {f.name: getattr(bert, f.name) for f in dataclasses.fields(model_lib.BertConfig)}
  return ElectraConfig(**{**fields, "embedding_size": hf.get("embedding_size", hf["hidden_size"]),
                          "pooler_act": "gelu"})


def config_to_hf(cfg: ElectraConfig, architecture: str) -> dict[str, Any]:
  return {**bert_formats.config_to_hf(cfg, architecture), "model_type": "electra",
          "embedding_size": cfg.embedding_dim, "summary_type": "first",
          "summary_use_proj": True, "summary_activation": "gelu",
          "summary_last_dropout": 0.1}


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[ElectraConfig, dict]:
  """(config, unrolled params on the host) of a HuggingFace ELECTRA directory: a
  discriminator's head read as `discriminator_dense` / `discriminator_prediction` (it stands
  in for the masked-LM head a generator has), "all" a task head too."""
  cfg = config_from_hf(formats.read_config_json(fileio.path(path) / "config.json"))
  origin = {}
  state = to_canonical(formats.read_hf_state(path, origin), origin)
  extra = {}
  if target != "encoder":
    for hf, ours in _DISCRIMINATOR.items():
      if f"{hf}.weight" in state:
        extra[ours] = {"kernel": np.ascontiguousarray(np.asarray(state.pop(f"{hf}.weight")).T),
                       "bias": np.asarray(state.pop(f"{hf}.bias"))}
  head = formats.pop_task_head(state) if target == "all" else {}
  params = bert_formats.canonical_to_params(
      state, cfg, "pretraining" if target == "all" else target,
      require_mlm=require_mlm and not extra and target != "all",
      source=f"HuggingFace checkpoint {path}", origin=origin, heads=HEADS)
  return cfg, {**params, **extra, **({"classifier": head} if head else {})}


def read_native(path: str, target: str = "pretraining", require_mlm: bool = True
                ) -> tuple[ElectraConfig, dict]:
  """A bert_jax export, as BERT's are read (bert_formats.load_native), with ELECTRA's
  pre-training heads that BERT's table lacks kept unless target="encoder": the
  discriminator's (it stands in for the masked-LM head) and a run's generator."""
  if target in ("all", "encoder"):
    return bert_formats.load_native(path, target, require_mlm)
  cfg, saved = formats.read_native(path)
  extra = {k: saved[k] for k in (*_DISCRIMINATOR.values(), "generator") if k in saved}
  params = bert_formats.canonical_to_params(
      bert_formats.params_to_canonical(saved, cfg), cfg, target,
      require_mlm=require_mlm and "discriminator_prediction" not in extra,
      source=f"bert_jax export {path}")
  return cfg, {**params, **extra}


# transformers' names of a fine-tuned head, per kind (formats.task_head_to_hf): the
# sequence classifier's dense layer and the multiple-choice summary are our pooler.
TASK_HEADS = formats.task_head_names("electra.pooler.dense",
                                     sequence=("classifier.dense", "classifier.out_proj"),
                                     choice="sequence_summary.summary")


def params_to_hf(params: dict, cfg: ElectraConfig, task_head: str = "sequence"
                 ) -> tuple[dict[str, np.ndarray], str]:
  """(transformers' state dict, its class) of what the params hold: ElectraForPreTraining (a
  discriminator), a fine-tuned classifier as the class of its kind `task_head`
  (formats.TASK_HEAD_CLASSES), ...ForMaskedLM (a generator) or ElectraModel."""
  head = params.get("classifier")
  discriminator = "discriminator_prediction" in params
  mlm = formats.heads(params)["mlm"]
  kind = ("ForPreTraining" if discriminator else formats.TASK_HEAD_CLASSES[task_head]
          if head is not None else "ForMaskedLM" if mlm else "Model")
  state = formats.renamed(bert_formats.params_to_canonical(params, cfg),
                         tuple((b, a) for a, b in _NAMES),
                         add="electra." if kind != "Model" else "")
  for hf, ours in _DISCRIMINATOR.items():
    if discriminator:
      state[f"{hf}.weight"] = np.ascontiguousarray(np.asarray(params[ours]["kernel"]).T)
      state[f"{hf}.bias"] = np.asarray(params[ours]["bias"])
  if head is not None and not discriminator:
    formats.task_head_to_hf(state, head, "electra.pooler.dense", TASK_HEADS[task_head])
  for k in [k for k in state if k.startswith(("electra.pooler.", "pooler."))]:
    del state[k]  # (ELECTRA has no pooler: a classifier's dense stands for ours)
  return state, "Electra" + kind


def export_hf(path: str, cfg: ElectraConfig, params: dict, tokenizer: Any = None,
              task_head: str = "sequence") -> list[str]:
  """model.safetensors + config.json of params_to_hf (config.json written last). A run of
  `--config.objective=electra` holds a generator too: it goes to PATH/generator as
  ElectraForMaskedLM (with the discriminator's embeddings, as the published pairs). Returns
  the directories written (each takes the vocabulary: bert_jax/convert.py)."""
  del tokenizer  # (a WordPiece vocabulary, as BERT's)
  out = [path]
  params = dict(params)
  generator = params.pop("generator", None)
  _write_hf(path, cfg, params, task_head)
  if generator is not None:
    tree = {**generator, "bert": {**generator["bert"], "embeddings": params["bert"]["embeddings"]}}
    _write_hf(str(fileio.path(path) / "generator"), _generator_config(cfg, tree), tree)
    out.append(str(fileio.path(path) / "generator"))
  return out


def _write_hf(path: str, cfg: ElectraConfig, params: dict, task_head: str = "sequence") -> None:
  state, architecture = params_to_hf(params, cfg, task_head)
  config = {**config_to_hf(cfg, architecture), **formats.label_fields(params)}
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config, indent=2))


def _generator_config(cfg: ElectraConfig, tree: dict) -> ElectraConfig:
  """The generator's sizes, read from its (unrolled) weights."""
  layers = tree["bert"]["encoder"]
  hidden, heads, _ = np.shape(layers["layer_0"]["attention"]["query"]["kernel"])
  return cfg.replace(hidden_size=hidden, num_heads=heads, num_layers=len(layers),
                     intermediate_size=np.shape(layers["layer_0"]["intermediate"]["bias"])[0],
                     embedding_size=cfg.embedding_dim)


FAMILIES = {"electra": dataclasses.replace(
    bert_formats.FAMILIES["bert"], name="electra", config=ElectraConfig,
    from_fields=config_from_fields, causal_lm=None, read_hf=read_hf,
    config_from_hf=config_from_hf, read_native=read_native,
    export_hf=export_hf,
    model_types=("electra",), hf_pooler=False,  # ElectraModel has none
    mlm_head=("an ElectraForMaskedLM (ELECTRA's generator)",
              "generator_predictions.*, generator_lm_head.*"),
    replaced_token_detection=replaced_token_detection,
    architecture_fields=bert_formats.FAMILIES["bert"].architecture_fields + ("family",
                                                                         "embedding_size"))}
