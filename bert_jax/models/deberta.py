"""DeBERTa-v3 (HuggingFace model_type `deberta-v2`; He et al. 2021/2023): BERT's post-norm
layers with disentangled attention. Each layer's scores add to content-to-content
(q . k) a content-to-position term (q_i . P^k[d(i, j)]) and a position-to-content term
(k_j . P^q[d(i, j)]), where P are projections (by the layer's own key / query weights when
`share_att_key`) of one table of relative-position embeddings shared by all layers (LayerNorm
applied), d(i, j) is i - j in log buckets (`position_buckets`, exact within half of them), and
everything is scaled by sqrt(head_dim x 3). No absolute positions enter the input
(`position_biased_input=False`) and there are no token types (`type_vocab_size=0`) in v3.
Pooled output: transformers' ContextPooler (dense + gelu on [CLS]). Masked-LM head: BERT's
(transform, LayerNorm, the word embeddings tied, a bias), transformers' DebertaV2ForMaskedLM
(`legacy`; its `lm_predictions` layout reads too). This module holds the config and presets,
the model, the HuggingFace format both ways, the FLOPs and the Family record.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax.models import bert as model_lib
from bert_jax.models import layers
from common import errors
from common import fileio

# The published DeBERTa-v3 sizes (microsoft/deberta-v3-*); each takes DEFAULTS.
PRESETS: dict[str, dict[str, int]] = {
    "deberta-v3-xsmall": dict(num_layers=12, hidden_size=384, num_heads=6, intermediate_size=1536),
    "deberta-v3-small": dict(num_layers=6, hidden_size=768, num_heads=12, intermediate_size=3072),
    "deberta-v3-base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "deberta-v3-large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
}
DEFAULTS = dict(vocab_size=128100, max_position_embeddings=512)
POSITION_TYPES = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaConfig(model_lib.BertConfig):
  """BertConfig with DeBERTa-v3's defaults and its relative-position fields."""
  family: str = "deberta-v2"
  type_vocab_size: int = 0
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-7
  pooler_act: str = "gelu"
  position_buckets: int = 256  # <= 0: exact relative positions up to max_relative_positions
  max_relative_positions: int = -1  # < 1: max_position_embeddings
  position_biased_input: bool = False  # absolute position embeddings added to the input
  share_att_key: bool = True  # positions projected by the layer's own key / query weights
  pos_att_type: tuple[str, ...] = ("p2c", "c2p")
  norm_rel_ebd: bool = True  # LayerNorm on the relative-position table

  def __post_init__(self):
    super().__post_init__()
    kinds = tuple(self.pos_att_type)
    object.__setattr__(self, "pos_att_type", kinds)
    if set(kinds) - set(POSITION_TYPES):
      raise errors.ConfigError(f"pos_att_type {kinds} holds an unknown kind: choose from "
                               f"{POSITION_TYPES}.")

  @property
  def relative_span(self) -> int:
    """Half the rows of the relative-position table (its rows: 2 x this)."""
    if self.position_buckets > 0:
      return self.position_buckets
    return self.max_relative_positions if self.max_relative_positions >= 1 \
        else self.max_position_embeddings

  @property
  def max_relative(self) -> int:
    return self.max_relative_positions if self.max_relative_positions >= 1 \
        else self.max_position_embeddings

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "DebertaConfig":
    return cls(**{**DEFAULTS, **families.preset_sizes(PRESETS, name, "DeBERTa"), **overrides})


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None) -> DebertaConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  DebertaConfig; `vocab_size` is the vocabulary's unless the fields set one."""
  return families.config_from_fields(DebertaConfig, fields, vocab_size, "deberta-v3",
                                     ("xsmall", "small", "base", "large"))


# ----------------------------------------------------------------------------
# The model.

def relative_buckets(rel, buckets: int, max_position: int, xp=jnp):
  """Relative distances -> their buckets (transformers' make_log_bucket_position): exact
  within +-buckets/2, logarithmic beyond, up to max_position. `xp`: jax.numpy, or numpy for
  static lengths."""
  if buckets <= 0:
    return rel
  mid = buckets // 2
  sign = xp.sign(rel)
  abs_pos = xp.where((rel < mid) & (rel > -mid), mid - 1, xp.abs(rel))
  log_pos = xp.ceil(xp.log(abs_pos.astype(xp.float32) / xp.float32(mid))
                    / xp.log(xp.float32((max_position - 1) / mid)) * xp.float32(mid - 1)) + mid
  return xp.where(abs_pos <= mid, rel, (log_pos * sign).astype(rel.dtype))


def relative_index(cfg: DebertaConfig, position_ids_BL: jax.Array) -> jax.Array:
  """[B, L, L] row of the relative table for query i and key j: bucket(p_i - p_j) + span,
  clipped (packed rows pass positions restarting at each example)."""
  p = position_ids_BL.astype(jnp.int32)
  rel = relative_buckets(p[:, :, None] - p[:, None, :], cfg.position_buckets, cfg.max_relative)
  span = cfg.relative_span
  return jnp.clip(rel + span, 0, 2 * span - 1)


def relative_rows(cfg: DebertaConfig, length: int) -> tuple[int, int]:
  """[lo, hi): the rows of the relative table that sequences of `length` reach."""
  span = cfg.relative_span
  reach = int(np.max(np.abs(relative_buckets(np.arange(length, dtype=np.int32),
                                              cfg.position_buckets, cfg.max_relative, np))))
  return max(span - reach, 0), min(span + reach, 2 * span - 1) + 1


def _dense(cfg, features, axes, name, use_bias=True):
  if use_bias:  # the layers' (their matmuls in cfg.matmul_dtype)
    return model_lib.dense(cfg, features, axes, name, layer=True)
  return nn.Dense(features, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  kernel_init=nn.with_logical_partitioning(
                      nn.initializers.normal(cfg.initializer_range), axes), name=name)


def _layer_norm(cfg, name):
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                      name=name)


def disentangled_attention(q_BLHK, k_BMHK, v_BMHK, pos_k_RHK, pos_q_RHK, index_BLM, bias_B1LM,
                           key, *, cfg: DebertaConfig, rate: float):
  """Softmax of the content-to-content scores plus, per cfg.pos_att_type, content-to-position
  (q_i . P^k[d(i, j)], `pos_k` the projected relative-position table) and position-to-content
  (k_j . P^q[d(i, j)]) at the pairs' relative rows `index`, each over sqrt(K x the kinds);
  inverted dropout at `rate` on the probabilities (`key`); times v."""
  scale = math.sqrt(q_BLHK.shape[-1] * (1 + len(cfg.pos_att_type)))
  scores_BHLM = jnp.einsum("BLHK,BMHK->BHLM", q_BLHK, k_BMHK) / scale
  if "c2p" in cfg.pos_att_type:
    c2p_BHLR = jnp.einsum("BLHK,RHK->BHLR", q_BLHK, pos_k_RHK)
    scores_BHLM += jnp.take_along_axis(c2p_BHLR, index_BLM[:, None], axis=-1) / scale
  if "p2c" in cfg.pos_att_type:
    p2c_BHMR = jnp.einsum("BMHK,RHK->BHMR", k_BMHK, pos_q_RHK)
    p2c_BHML = jnp.take_along_axis(p2c_BHMR, jnp.swapaxes(index_BLM, 1, 2)[:, None], axis=-1)
    scores_BHLM += jnp.swapaxes(p2c_BHML, -1, -2) / scale
  probs = jax.nn.softmax(scores_BHLM.astype(jnp.float32) + bias_B1LM, axis=-1).astype(cfg.dtype)
  probs = layers.dropout(probs, rate, key, cfg.dropout_rng)
  return jnp.einsum("BHLM,BMHK->BLHK", probs, v_BMHK)


class Layer(nn.Module):
  """One post-norm layer with disentangled self-attention."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x_BLD, bias_B1LM, index_BLM, rel_RD, deterministic: bool):
    cfg = self.config
    heads, k = cfg.num_heads, cfg.head_dim
    proj = lambda name: _dense(cfg, cfg.hidden_size, ("embed", "mlp"), name)
    split = lambda t: t.reshape(t.shape[:-1] + (heads, k))
    query, key = proj("query_proj"), proj("key_proj")
    q_BLHK, k_BMHK, v_BMHK = split(query(x_BLD)), split(key(x_BLD)), split(proj("value_proj")(x_BLD))
    pos_k_RHK = pos_q_RHK = None
    if "c2p" in cfg.pos_att_type:
      pos_k_RHK = split((key if cfg.share_att_key else proj("pos_key_proj"))(rel_RD))
    if "p2c" in cfg.pos_att_type:
      pos_q_RHK = split((query if cfg.share_att_key else proj("pos_query_proj"))(rel_RD))
    rate = 0.0 if deterministic else cfg.attention_dropout_rate
    probs_dropout = model_lib.Dropout(cfg.attention_dropout_rate, cfg.dropout_rng)  # Dropout_0
    drop_key = probs_dropout.key() if rate > 0 else None
    attend = functools.partial(disentangled_attention, cfg=cfg, rate=rate)
    if cfg.remat == "attention":
      attend = layers.recomputed(attend)
    ctx_BLHK = attend(q_BLHK, k_BMHK, v_BMHK, pos_k_RHK, pos_q_RHK, index_BLM, bias_B1LM, drop_key)
    ctx_BLD = ctx_BLHK.reshape(x_BLD.shape)
    drop = lambda y: model_lib.Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)(y, deterministic)
    out = drop(_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "attention_output")(ctx_BLD))
    a_BLD = _layer_norm(cfg, "attention_LayerNorm")(x_BLD + out)
    h = model_lib.ACTIVATIONS[cfg.hidden_act](
        _dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(a_BLD))
    out = drop(_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h))
    return _layer_norm(cfg, "output_LayerNorm")(a_BLD + out)


class Embeddings(nn.Module):
  """Word (+ absolute positions, + token types where the config has them), projection to
  the hidden size when narrower, LayerNorm, padding rows zeroed, dropout."""
  config: DebertaConfig

  def setup(self):
    cfg = self.config
    embed = lambda n, name: nn.Embed(
        n, cfg.embedding_dim, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name,
        embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(cfg.initializer_range), ("vocab" if name == "word_embeddings"
                                                            else None, "embed")))
    self.word_embeddings = embed(cfg.vocab_size, "word_embeddings")
    if cfg.position_biased_input:
      self.position_embeddings = embed(cfg.max_position_embeddings, "position_embeddings")
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = embed(cfg.type_vocab_size, "token_type_embeddings")
    if cfg.embedding_dim != cfg.hidden_size:
      self.embed_proj = _dense(cfg, cfg.hidden_size, (None, "embed"), "embed_proj", use_bias=False)
    self.LayerNorm = _layer_norm(cfg, "LayerNorm")
    self.dropout = model_lib.Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)

  def __call__(self, input_ids, segment_ids, position_ids, input_mask, deterministic):
    cfg = self.config
    x = self.word_embeddings(input_ids)
    if cfg.position_biased_input:
      x = x + model_lib.one_hot_lookup(self.position_embeddings, position_ids)
    if cfg.type_vocab_size > 0:
      x = x + model_lib.one_hot_lookup(self.token_type_embeddings, segment_ids)
    if cfg.embedding_dim != cfg.hidden_size:
      x = self.embed_proj(x)
    x = self.LayerNorm(x) * input_mask[..., None].astype(cfg.dtype)
    return self.dropout(x, deterministic=deterministic)


class Encoder(nn.Module):
  """The layers and the relative-position table they share."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x_BLD, bias_B1LM, index_BLM, deterministic: bool, all_layers: bool = False):
    cfg = self.config
    table = self.param("rel_embeddings", nn.with_logical_partitioning(
        nn.initializers.normal(cfg.initializer_range), (None, "embed")),
        (2 * cfg.relative_span, cfg.hidden_size), cfg.param_dtype)
    # Only the rows some (query, key) pair of this length reaches: |p_i - p_j| <= L - 1, so
    # rows span +- bucket(L - 1) (at L=64 of deberta-v3: 127 of 512; transformers projects
    # and scores all of them). The same rows are gathered: the outputs do not change.
    lo, hi = relative_rows(cfg, x_BLD.shape[1])
    rel_RD = jnp.asarray(table[lo:hi], cfg.dtype)
    index_BLM = index_BLM - lo
    if cfg.norm_rel_ebd:
      rel_RD = _layer_norm(cfg, "LayerNorm")(rel_RD)
    rel_RD = model_lib.Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)(rel_RD, deterministic)
    layer_cls = Layer
    if cfg.remat not in ("none", "attention"):
      layer_cls = nn.remat(Layer, static_argnums=(5,), policy=layers.REMAT_POLICIES[cfg.remat])
    states = [x_BLD]
    for i in range(cfg.num_layers):
      x_BLD = layer_cls(cfg, name=f"layer_{i}")(x_BLD, bias_B1LM, index_BLM, rel_RD, deterministic)
      states.append(x_BLD)
    return states if all_layers else x_BLD


class DebertaModel(nn.Module):
  """The encoder: (sequence output [B, L, D], pooled output [B, D] or None), with
  model.BertModel's inputs and keywords (packed rows: positions restarting per example give
  the relative positions, the block-diagonal mask keeps attention inside an example).
  `pooled_only` and `rows_at` change nothing computed (every row is; rows_at gathers)."""
  config: DebertaConfig
  add_pooler: bool = True
  pooled_only: bool = False

  def setup(self):
    cfg = self.config
    if cfg.scan_layers:
      raise errors.ConfigError("DeBERTa's layers are not scanned: set --config.model.scan_layers=False.")
    self.embeddings = Embeddings(cfg)
    self.encoder = Encoder(cfg)
    if self.add_pooler:
      self.pooler = model_lib.dense(cfg, cfg.hidden_size, ("embed", None), "pooler")

  def _inputs(self, input_ids, segment_ids, input_mask, position_ids, packed_example_ids):
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_position_embeddings:
      raise errors.ConfigError(
          f"Sequence length {length} exceeds max_position_embeddings "
          f"({cfg.max_position_embeddings}): truncate the input to that many tokens.")
    segment_ids = jnp.zeros_like(input_ids) if segment_ids is None else segment_ids
    input_mask = jnp.ones_like(input_ids) if input_mask is None else input_mask
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if packed_example_ids is None:
      bias = model_lib.attention_bias(input_mask, jnp.float32)
    else:
      bias = model_lib.packed_attention_bias(packed_example_ids, jnp.float32)
      input_mask = (packed_example_ids > 0).astype(input_mask.dtype)
    return segment_ids, input_mask, position_ids, bias

  def __call__(self, input_ids, segment_ids=None, input_mask=None, deterministic: bool = True,
               position_ids=None, packed_example_ids=None, cls_positions=None, rows_at=None):
    segment_ids, input_mask, position_ids, bias = self._inputs(
        input_ids, segment_ids, input_mask, position_ids, packed_example_ids)
    x_BLD = self.embeddings(input_ids, segment_ids, position_ids, input_mask, deterministic)
    x_BLD = self.encoder(x_BLD, bias, relative_index(self.config, position_ids), deterministic)
    pooled = None
    if self.add_pooler:
      cls = x_BLD[:, 0] if cls_positions is None else model_lib.gather_positions(x_BLD,
                                                                                 cls_positions)
      pooled = model_lib.ACTIVATIONS[self.config.pooler_act](self.pooler(cls))
    if rows_at is not None:
      return model_lib.gather_positions(x_BLD, rows_at), pooled
    return (None if self.pooled_only and self.add_pooler else x_BLD), pooled

  def hidden_states(self, input_ids, segment_ids=None, input_mask=None,
                    deterministic: bool = True) -> list[jax.Array]:
    """[embeddings, layer 1, ..., layer N], each [B, L, D] (transformers' hidden_states)."""
    segment_ids, input_mask, position_ids, bias = self._inputs(
        input_ids, segment_ids, input_mask, None, None)
    x_BLD = self.embeddings(input_ids, segment_ids, position_ids, input_mask, deterministic)
    return self.encoder(x_BLD, bias, relative_index(self.config, position_ids), deterministic,
                        all_layers=True)

  def tokens(self, x_BLD):
    return x_BLD

  def attend_vocab(self, x_BPD):
    return self.embeddings.word_embeddings.attend(x_BPD)


class DebertaForMaskedLM(model_lib.BertForPreTraining):
  """The encoder + BERT's masked-LM head on it (transformers' DebertaV2ForMaskedLM):
  BertForPreTraining's tree and outputs with DeBERTa's encoder; no next-sentence head."""
  nsp: bool = False

  def setup(self):
    cfg = self.config
    if self.nsp:
      raise errors.ConfigError("DeBERTa has no next-sentence prediction: set "
                               "--config.data.nsp=False.")
    self.bert = DebertaModel(cfg, add_pooler=False)
    self.transform = model_lib.dense(cfg, cfg.embedding_dim, ("embed", None), "transform")
    self.transform_LayerNorm = _layer_norm(cfg, "transform_LayerNorm")
    self.output_bias = self.param("output_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,), cfg.param_dtype)


def forward_flops(cfg: DebertaConfig, seq_len: int, num_predictions: int, nsp: bool = True,
                  last_rows: int | None = None) -> int:
  """BERT's count (every row of the last layer: DeBERTa computes them all) plus, per layer,
  the two position terms: each query (c2p) and key (p2c) against every row of the relative
  table that the length reaches (`relative_rows`). The table's projections run once per batch, not per sequence, and are left out
  (a conservative count: at batch 8 they would add ~1/8 of the position terms' share)."""
  del last_rows, nsp
  lo, hi = relative_rows(cfg, seq_len)  # the table's rows the model computes with
  L, D, R = seq_len, cfg.hidden_size, hi - lo
  per_layer = len(cfg.pos_att_type) * 2 * L * R * D
  return model_lib.forward_flops(cfg, seq_len, num_predictions, nsp=False) \
      + cfg.num_layers * per_layer


# ----------------------------------------------------------------------------
# HuggingFace format: transformers' DebertaV2* names <-> our tree.

def _rules(cfg: DebertaConfig) -> list[tuple[str, tuple[str, ...], bool]]:
  """(transformers' name without the `deberta.` prefix, our path in the encoder tree,
  transpose?) of every encoder weight."""
  out = [("embeddings.word_embeddings.weight", ("embeddings", "word_embeddings", "embedding"), False),
         ("embeddings.LayerNorm.weight", ("embeddings", "LayerNorm", "scale"), False),
         ("embeddings.LayerNorm.bias", ("embeddings", "LayerNorm", "bias"), False),
         ("encoder.rel_embeddings.weight", ("encoder", "rel_embeddings"), False)]
  if cfg.position_biased_input:
    out.append(("embeddings.position_embeddings.weight",
                ("embeddings", "position_embeddings", "embedding"), False))
  if cfg.type_vocab_size > 0:
    out.append(("embeddings.token_type_embeddings.weight",
                ("embeddings", "token_type_embeddings", "embedding"), False))
  if cfg.embedding_dim != cfg.hidden_size:
    out.append(("embeddings.embed_proj.weight", ("embeddings", "embed_proj", "kernel"), True))
  if cfg.norm_rel_ebd:
    out += [("encoder.LayerNorm.weight", ("encoder", "LayerNorm", "scale"), False),
            ("encoder.LayerNorm.bias", ("encoder", "LayerNorm", "bias"), False)]
  dense = {"attention.self.query_proj": "query_proj", "attention.self.key_proj": "key_proj",
           "attention.self.value_proj": "value_proj", "attention.output.dense": "attention_output",
           "intermediate.dense": "intermediate", "output.dense": "output"}
  if not cfg.share_att_key:
    for kind, name in (("c2p", "pos_key_proj"), ("p2c", "pos_query_proj")):
      if kind in cfg.pos_att_type:
        dense[f"attention.self.{name}"] = name
  norms = {"attention.output.LayerNorm": "attention_LayerNorm", "output.LayerNorm": "output_LayerNorm"}
  for i in range(cfg.num_layers):
    hf, ours = f"encoder.layer.{i}", ("encoder", f"layer_{i}")
    for a, b in dense.items():
      out += [(f"{hf}.{a}.weight", ours + (b, "kernel"), True),
              (f"{hf}.{a}.bias", ours + (b, "bias"), False)]
    for a, b in norms.items():
      out += [(f"{hf}.{a}.weight", ours + (b, "scale"), False),
              (f"{hf}.{a}.bias", ours + (b, "bias"), False)]
  return out


# The masked-LM head: transformers' legacy layout (cls.predictions, what it writes) and the
# newer lm_predictions.lm_head (read).
_MLM = {"cls.predictions.transform.dense": "transform",
        "cls.predictions.transform.LayerNorm": "transform_LayerNorm"}
_MLM_NEW = {"lm_predictions.lm_head.dense": "transform",
            "lm_predictions.lm_head.LayerNorm": "transform_LayerNorm"}
# What DeBERTa's classes hold outside the encoder: the masked-LM heads, v3's replaced-token
# head, the pooler, the task heads (left out, named, where a read does not use them).
HEADS = formats.HEADS + ("lm_predictions.", "mask_predictions.", "pooler.")


def config_from_hf(hf: Mapping[str, Any]) -> DebertaConfig:
  missing = [k for k in formats.HF_REQUIRED if not isinstance(hf.get(k), int)]
  if missing:
    raise formats.CorruptCheckpointFileError(
        f"config.json lacks {', '.join(missing)} (or not as an integer): fix the file.")
  if hf.get("conv_kernel_size", 0) > 0:
    raise errors.ConfigError("This DeBERTa-v2 checkpoint has the convolution layer "
                             "(conv_kernel_size, deberta-v2-xlarge/xxlarge), which bert_jax "
                             "does not read: DeBERTa-v3 checkpoints have none.")
  if not hf.get("relative_attention", False):
    raise errors.ConfigError("This deberta-v2 checkpoint has no relative attention "
                             "(relative_attention=false), which bert_jax does not read.")
  kinds = hf.get("pos_att_type") or []
  kinds = kinds.split("|") if isinstance(kinds, str) else list(kinds)
  return DebertaConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 512),
      type_vocab_size=hf.get("type_vocab_size", 0), hidden_act=hf.get("hidden_act", "gelu"),
      hidden_dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-7),
      initializer_range=hf.get("initializer_range", 0.02),
      embedding_size=hf.get("embedding_size") if hf.get("embedding_size") != hf["hidden_size"]
      else None,
      pooler_act=hf.get("pooler_hidden_act", "gelu"),
      position_buckets=hf.get("position_buckets", -1),
      max_relative_positions=hf.get("max_relative_positions", -1),
      position_biased_input=hf.get("position_biased_input", True),
      share_att_key=hf.get("share_att_key", False), pos_att_type=tuple(k.strip() for k in kinds),
      norm_rel_ebd="layer_norm" in str(hf.get("norm_rel_ebd", "none")).lower())


def config_to_hf(cfg: DebertaConfig, architecture: str, num_labels: int = 0) -> dict[str, Any]:
  out = {"architectures": [architecture], "model_type": "deberta-v2",
         "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
         "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
         "intermediate_size": cfg.intermediate_size, "hidden_act": cfg.hidden_act,
         "hidden_dropout_prob": cfg.hidden_dropout_rate,
         "attention_probs_dropout_prob": cfg.attention_dropout_rate,
         "max_position_embeddings": cfg.max_position_embeddings,
         "type_vocab_size": cfg.type_vocab_size, "initializer_range": cfg.initializer_range,
         "layer_norm_eps": cfg.layer_norm_eps, "relative_attention": True,
         "max_relative_positions": cfg.max_relative_positions,
         "position_buckets": cfg.position_buckets,
         "position_biased_input": cfg.position_biased_input,
         "share_att_key": cfg.share_att_key, "pos_att_type": "|".join(cfg.pos_att_type),
         "norm_rel_ebd": "layer_norm" if cfg.norm_rel_ebd else "none",
         "pooler_hidden_size": cfg.hidden_size, "pooler_hidden_act": cfg.pooler_act,
         "pooler_dropout": 0, "pad_token_id": 0, "legacy": True}
  if cfg.embedding_size:
    out["embedding_size"] = cfg.embedding_size
  if num_labels:
    out.update(id2label={str(i): f"LABEL_{i}" for i in range(num_labels)},
               label2id={f"LABEL_{i}": i for i in range(num_labels)})
  return out


def _linear(w, transpose):
  w = np.asarray(w, np.float32)
  return np.ascontiguousarray(w.T) if transpose else w


def read_hf(path: str, target: str = "pretraining", require_mlm: bool = True
            ) -> tuple[DebertaConfig, dict]:
  """(config, unrolled params on the host) of a HuggingFace DeBERTa-v2/v3 directory: the
  encoder (complete), the masked-LM head when present ("pretraining"; `require_mlm`: a
  directory without one is an error naming it), the pooler and a task head ("all"). Any
  other tensor but another task's head (HEADS, named as left out) is refused, as by every
  family's reader (formats.check_read)."""
  cfg = config_from_hf(formats.read_config_json(fileio.path(path) / "config.json"))
  source, origin = f"HuggingFace checkpoint {path}", {}
  state = formats.renamed(formats.read_hf_state(path, origin), (), strip="deberta.",
                          origin=origin)
  state = formats.untie_decoder(state, source, origin)
  if not cfg.position_biased_input:  # a table v3 uploads may hold unused (transformers too)
    state.pop("embeddings.position_embeddings.weight", None)
  missing = [hf for hf, _, _ in _rules(cfg) if hf not in state]
  encoder: dict = {}
  for hf, ours, transpose in _rules(cfg):
    if hf in state:
      formats.set_path(encoder, ours, _linear(state.pop(hf), transpose))
  params = encoder if target == "encoder" else _read_heads(state, encoder, target)
  model = formats.describe_model(cfg, target)
  left_out = formats.check_read(source, model, missing=missing, unused=list(state),
                                heads=HEADS, origin=origin, num_layers=cfg.num_layers)
  if target == "pretraining" and require_mlm and "transform" not in params:
    raise formats.CheckpointMismatchError(
        f"{source} has no masked-LM head (cls.predictions.*): continue pre-training from a "
        "DebertaV2ForMaskedLM checkpoint, or fine-tune it (which reads the encoder alone).")
  formats.warn_left_out(source, model, left_out, origin)
  return cfg, params


def _read_heads(state: dict, encoder: dict, target: str) -> dict:
  """The tree of `encoder` with the pooler and the masked-LM head (when whole) of `state`
  and, for "all", its task head (each popped from `state`)."""
  if "pooler.dense.weight" in state:
    encoder["pooler"] = {"kernel": _linear(state.pop("pooler.dense.weight"), True),
                         "bias": _linear(state.pop("pooler.dense.bias"), False)}
  params: dict = {"bert": encoder}
  names = _MLM if "cls.predictions.transform.dense.weight" in state else _MLM_NEW
  bias = next((b for b in ("cls.predictions.bias", "lm_predictions.lm_head.bias")
               if b in state), None)
  if bias is not None and all(f"{hf}.weight" in state for hf in names):
    for hf, ours in names.items():
      key = "kernel" if ours == "transform" else "scale"
      params[ours] = {key: _linear(state.pop(f"{hf}.weight"), ours == "transform"),
                      "bias": _linear(state.pop(f"{hf}.bias"), False)}
    params["output_bias"] = _linear(state.pop(bias), False)
  if target == "all":
    head = formats.pop_task_head(state)
    if head:
      params["classifier"] = head
  return params


def params_to_hf(params: dict, cfg: DebertaConfig, task_head: str = "sequence"
                 ) -> tuple[dict[str, np.ndarray], str]:
  """(transformers' state dict, its class): DebertaV2ForMaskedLM (the masked-LM head), a
  classifier as the class of its kind `task_head` (formats.TASK_HEAD_CLASSES), or
  DebertaV2Model."""
  params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), nn.unbox(params))
  encoder = params["bert"]
  kind = ("ForMaskedLM" if "transform" in params else formats.TASK_HEAD_CLASSES[task_head]
          if "classifier" in params else "Model")
  prefix = "" if kind == "Model" else "deberta."
  state = {}
  for hf, ours, transpose in _rules(cfg):
    node = encoder
    for p in ours:
      node = node[p]
    state[prefix + hf] = _linear(node, transpose)
  if kind == "ForMaskedLM":
    for hf, ours in _MLM.items():
      key = "kernel" if ours == "transform" else "scale"
      state[f"{hf}.weight"] = _linear(params[ours][key], ours == "transform")
      state[f"{hf}.bias"] = params[ours]["bias"]
    state["cls.predictions.bias"] = params["output_bias"]
    state["cls.predictions.decoder.bias"] = params["output_bias"]
  if kind == formats.TASK_HEAD_CLASSES.get(task_head):
    for name, key, transpose in (("weight", "kernel", True), ("bias", "bias", False)):
      if "pooler" in encoder:  # (ContextPooler: the sequence and choice heads' dense layer)
        state[f"pooler.dense.{name}"] = _linear(encoder["pooler"][key], transpose)
    formats.task_head_to_hf(state, params["classifier"], "pooler.dense",
                            formats.task_head_names("pooler.dense")[task_head])
  return state, "DebertaV2" + kind


def export_hf(path: str, cfg: DebertaConfig, params: dict, tokenizer: Any = None,
              task_head: str = "sequence") -> None:
  """model.safetensors + config.json (written last) that transformers loads."""
  del tokenizer
  state, architecture = params_to_hf(params, cfg, task_head)
  num_labels = params["classifier"]["kernel"].shape[-1] if "classifier" in params else 0
  d = fileio.path(path)
  d.mkdir(parents=True, exist_ok=True)
  formats.write_safetensors(d / "model.safetensors", state, metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps(config_to_hf(cfg, architecture, num_labels), indent=2))


ARCHITECTURE_FIELDS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "type_vocab_size", "hidden_act", "embedding_size",
                       "position_buckets", "max_relative_positions", "position_biased_input",
                       "share_att_key", "pos_att_type", "norm_rel_ebd")

FAMILIES = {"deberta-v2": families.Family(
    name="deberta-v2", config=DebertaConfig, from_fields=config_from_fields,
    encoder=DebertaModel,
    masked_lm=lambda cfg, nsp: DebertaForMaskedLM(cfg, nsp=nsp),
    read_hf=read_hf, config_from_hf=config_from_hf, read_native=formats.read_native_tree,
    export_hf=export_hf,
    model_types=("deberta-v2",),
    architecture_fields=ARCHITECTURE_FIELDS,
    dropout={"hidden_dropout_rate": None, "attention_dropout_rate": None},
    forward_flops=forward_flops, padded_vocab=True, names_specials=True,
    vocab_kind="sentencepiece",
    mlm_head=("a DebertaV2ForMaskedLM", "cls.predictions.* or lm_predictions.lm_head.*"))}
