"""BERT encoder and pre-training heads in Flax linen.

Axis legend for tensor names (`x_BLD` is [batch, length, hidden]):
  B batch, L query length, M key length, D hidden, H heads, K head dim,
  F feed-forward (intermediate), P masked-LM predictions per sequence, V vocab.

Parameters carry logical axis names (`vocab`, `embed`, `mlp`, `heads`, `kv`,
`layers`); activations carry `activation_*` names. A rules table (see
`bert_jax.sharding`) maps them onto the mesh axes, so the model states its
sharding once and never mentions devices.

The building blocks every family shares (the config base, dropout, attention biases,
gathers) are in layers.py and the attention computations in bert_attention.py; the names
that lived here before are importable from here too.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.models import bert_attention
from bert_jax.models import fp8
from bert_jax.models.bert_attention import ATTENTION_IMPLS, fused_attention
from bert_jax.models.layers import (ACTIVATIONS, DROPOUT_RNGS, REMAT_POLICIES, Dropout,
                                    ModelConfig, Rows, attention_bias, causal_bias,
                                    gather_positions, layer_stack, one_hot_lookup,
                                    packed_attention_bias, recomputed, take_rows)
from common import errors

PRESETS: dict[str, dict[str, int]] = {
    # name: (layers, hidden, heads); intermediate is always 4 * hidden.
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16),
}


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
  """Everything that defines the network. Variants come from `.replace(...)`."""
  family = "bert"  # (a class attribute, not a field: bert_jax/families.py)
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_act: str = "gelu_tanh"  # "gelu_tanh" (original TF) or "gelu" (erf, HuggingFace)
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  dtype: Any = "float32"  # compute dtype ("bfloat16" for mixed precision)
  param_dtype: Any = "float32"  # master weights
  # Recompute in the backward pass instead of keeping: "none"; "attention" (the attention's
  # scores, softmax and dropout masks: no [B, H, L, M] tensor kept); "dots" (all but the
  # layers' matmul outputs); "full" (each layer from its input).
  remat: str = "none"
  scan_layers: bool = False  # nn.scan over layers: compile time flat in depth
  # The attention kernel: None = jax.nn.dot_product_attention with the additive bias;
  # "cudnn" = cuDNN's fused flash attention (GPU, bfloat16/float16) and "xla" = the same
  # arguments on XLA, both without probability dropout (`fused_attention`); "pallas" =
  # bert_jax.flash, with the probability dropout fused (the explicit path's masks);
  # "explicit" = None (a pre-training job on GPU chooses "pallas" for None at long lengths:
  # bert_attention.gpu_defaults).
  attention_impl: str | None = None
  # The encoder layers' dense matmuls (q, k, v, attention output, intermediate, output): None
  # in `dtype`; "fp8" through FP8 (E4M3 operands, E5M2 gradients, per-tensor current scaling:
  # models/fp8.py), the embeddings, heads and everything else as before.
  matmul_dtype: str | None = None
  # Dropout's random bits: "hash" (a counter hash keyed by threefry; masks ~7x cheaper
  # on CPU) or "threefry" (jax.random.bernoulli, as flax's nn.Dropout). See `Dropout`.
  dropout_rng: str = "hash"
  # Each token attends only to itself and the tokens before it (a left-to-right encoder: the
  # paper's "LTR & No NSP" ablation, left-only at fine-tuning too); the pooled output is
  # then the last real token's, the one that sees the whole input.
  causal: bool = False
  # Positions start this far into the position table (RoBERTa: 2, after its padding index;
  # bert_jax/models/roberta.py), so the longest input is max_position_embeddings - position_offset.
  position_offset: int = 0
  # ELECTRA: the embedding tables' width when it differs from hidden_size (projected to it by
  # `embeddings_project`; the masked-LM head maps back to it), and the pooler's activation
  # (its sequence classifier: gelu).
  embedding_size: int | None = None
  pooler_act: str = "tanh"

  def __post_init__(self):
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if self.hidden_size % self.num_heads:
      raise errors.ConfigError(f"hidden_size {self.hidden_size} is not divisible by "
                               f"num_heads {self.num_heads}: each attention head takes an "
                               "equal share (config.model.hidden_size / num_heads, or the "
                               "checkpoint's config.json).")
    if self.hidden_act not in ACTIVATIONS:
      raise errors.ConfigError(f"hidden_act {self.hidden_act!r} unknown; "
                       f"choose one of {sorted(ACTIVATIONS)}.")
    if self.dropout_rng not in DROPOUT_RNGS:
      raise errors.ConfigError(f"dropout_rng {self.dropout_rng!r} unknown; "
                       f"choose one of {DROPOUT_RNGS}.")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise errors.ConfigError(f"attention_impl {self.attention_impl!r} unknown; choose one of "
                               f"{', '.join(a for a in ATTENTION_IMPLS if a)} "
                               "(model.attention_impl), or leave it unset.")
    if self.attention_impl == "explicit":
      object.__setattr__(self, "attention_impl", None)
    if self.attention_impl == "cudnn" and self.dtype not in (jnp.bfloat16, jnp.float16):
      raise errors.ConfigError(f"attention_impl 'cudnn' computes in bfloat16 or float16, not "
                               f"{self.dtype}: set model.dtype=bfloat16 (or attention_impl=xla).")
    if self.matmul_dtype not in fp8.MATMUL_DTYPES:
      raise errors.ConfigError(f"matmul_dtype {self.matmul_dtype!r} unknown: set "
                               "model.matmul_dtype=fp8, or leave it unset (the matmuls in "
                               "model.dtype).")
    if self.matmul_dtype == "fp8" and self.dtype == jnp.float16:
      raise errors.ConfigError("matmul_dtype fp8 dequantises in model.dtype, and float16 "
                               "cannot hold the small scales of unscaled gradients: set "
                               "model.dtype=bfloat16 (or float32) with FP8 matmuls.")
    if self.remat not in REMAT_POLICIES:
      raise errors.ConfigError(f"remat {self.remat!r} unknown; "
                       f"choose one of {sorted(REMAT_POLICIES)}.")

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "BertConfig":
    sizes = families.preset_sizes(PRESETS, name, "model")
    sizes["intermediate_size"] = 4 * sizes["hidden_size"]
    return cls(**{**sizes, **overrides})

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def max_length(self) -> int:
    return self.max_position_embeddings - self.position_offset

  @property
  def embedding_dim(self) -> int:
    return self.embedding_size or self.hidden_size


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None) -> BertConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  BertConfig; `vocab_size` is the vocabulary's, used when the fields leave it unset."""
  overrides = {k: v for k, v in fields.items() if k != "preset" and v is not None}
  if "hidden_size" in overrides and "intermediate_size" not in overrides:
    overrides["intermediate_size"] = 4 * overrides["hidden_size"]
  if "vocab_size" not in overrides:
    if vocab_size is None:
      raise errors.ConfigError("config.model.vocab_size is unset and there is no vocabulary to take "
                       "it from; set --config.model.vocab_size.")
    overrides["vocab_size"] = vocab_size
  elif vocab_size is not None and overrides["vocab_size"] < vocab_size:
    raise errors.ConfigError(f"config.model.vocab_size={overrides['vocab_size']} is smaller than the "
                     f"vocabulary ({vocab_size} entries).")
  return BertConfig.from_preset(fields.get("preset", "base"), **overrides)


def _truncated_normal(stddev: float):
  """TF's truncated_normal_initializer: normal(0, stddev) cut at +-2 stddev."""
  def init(key, shape, dtype=jnp.float32):
    return stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)
  return init


def _kernel_init(cfg: BertConfig, axes: tuple[str, ...]):
  return nn.with_logical_partitioning(_truncated_normal(cfg.initializer_range), axes)


def _zeros(axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=_zeros(("embed",)), name=name)


def dense(cfg: BertConfig, features: int, axes: tuple[str, str], name: str,
          layer: bool = False) -> nn.Dense:
  """A dense layer; `layer`: an encoder layer's, its matmul in cfg.matmul_dtype."""
  return nn.Dense(features, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  kernel_init=_kernel_init(cfg, axes), bias_init=_zeros(axes[1:]),
                  dot_general=fp8.dot_general(cfg.matmul_dtype) if layer else None, name=name)


class Embeddings(nn.Module):
  """Token + segment + learned absolute position embeddings, LayerNorm, dropout."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.embedding_dim, dtype=cfg.dtype,
                              param_dtype=cfg.param_dtype)
    self.word_embeddings = embed(cfg.vocab_size, embedding_init=_kernel_init(cfg, ("vocab", "embed")))
    self.position_embeddings = embed(cfg.max_position_embeddings,
                                     embedding_init=_kernel_init(cfg, (None, "embed")))
    self.token_type_embeddings = embed(cfg.type_vocab_size,
                                       embedding_init=_kernel_init(cfg, (None, "embed")))
    self.LayerNorm = _layer_norm(self.config, "LayerNorm")
    self.dropout = Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)

  def __call__(self, input_ids_BL, segment_ids_BL, position_ids_BL, deterministic):
    cfg = self.config
    if cfg.position_offset:
      position_ids_BL = position_ids_BL + cfg.position_offset
    if cfg.type_vocab_size == 1:  # one token type (RoBERTa): a pair's second segment too
      segment_ids_BL = jnp.zeros_like(segment_ids_BL)
    x_BLD = (self.word_embeddings(input_ids_BL)
             + self.position_lookup(position_ids_BL)
             + self.token_type_lookup(segment_ids_BL))
    x_BLD = self.LayerNorm(x_BLD)
    return self.dropout(x_BLD, deterministic=deterministic)

  def position_lookup(self, position_ids_BL):
    return one_hot_lookup(self.position_embeddings, position_ids_BL)

  def token_type_lookup(self, segment_ids_BL):
    return one_hot_lookup(self.token_type_embeddings, segment_ids_BL)


class _Projection(nn.Module):
  """Dense over the trailing `contract` input dims into `features` (q/k/v and output).

  Same parameters as nn.DenseGeneral (`kernel` [in..., out...], `bias` [out...]),
  but the kernel is created at its real rank: DenseGeneral initialises a
  flattened kernel and unboxes it, which fails under a mesh (jax.set_mesh) once
  the kernel carries logical axis names of the unflattened rank.
  """
  config: BertConfig
  features: tuple[int, ...]
  axes: tuple[str, ...]  # logical names of the kernel axes
  contract: int = 1

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    n = self.contract
    kernel = self.param("kernel", _kernel_init(cfg, self.axes),
                        x.shape[-n:] + tuple(self.features), cfg.param_dtype)
    bias = self.param("bias", _zeros(self.axes[n:]), tuple(self.features), cfg.param_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.dtype)
    dims = (((tuple(range(x.ndim - n, x.ndim))), tuple(range(n))), ((), ()))
    return fp8.dot_general(cfg.matmul_dtype)(x, kernel, dims) + bias


class SelfAttention(nn.Module):
  """Bidirectional multi-head self-attention with an additive padding bias.

  With `query_positions_BE`, only those queries are computed (keys and values stay
  the whole sequence): the output is [B, E, D], the rows of the full output there.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x_BLD, bias_B11M, deterministic, query_positions_BE=None):
    cfg = self.config
    proj = functools.partial(_Projection, cfg, (cfg.num_heads, cfg.head_dim),
                             ("embed", "heads", "kv"))
    q_BLHK = proj(name="query")(take_rows(x_BLD, query_positions_BE, 1))
    k_BMHK = proj(name="key")(x_BLD)
    v_BMHK = proj(name="value")(x_BLD)
    q_BLHK = nn.with_logical_constraint(
        q_BLHK, ("activation_batch", "activation_length", "activation_heads", "activation_kv"))
    if cfg.attention_impl == "pallas" and (deterministic or cfg.attention_dropout_rate == 0.0
                                           or cfg.dropout_rng == "hash"):  # else: explicit
      rate = 0.0 if deterministic else cfg.attention_dropout_rate
      key = Dropout(rate, cfg.dropout_rng).key() if rate > 0 else None  # the explicit path's
      ctx_BLHK = bert_attention.flash_attention(q_BLHK, k_BMHK, v_BMHK, bias_B11M, query_positions_BE, rate, key,
                        cfg.causal)
      return _Projection(cfg, (cfg.hidden_size,), ("heads", "kv", "embed"), contract=2,
                         name="output")(ctx_BLHK)
    if bias_B11M.shape[2] > 1:  # packed rows: a bias per query
      bias_B11M = take_rows(bias_B11M, query_positions_BE, 2)
    kernel = False  # cuDNN's fused attention keeps no [B, H, L, M] tensor: nothing to recompute
    if deterministic or cfg.attention_dropout_rate == 0.0:
      attend = functools.partial(fused_attention, implementation=cfg.attention_impl)
      extra = ()
      kernel = cfg.attention_impl == "cudnn"
    else:
      # Dropout on the attention probabilities (as in BERT) needs them explicitly;
      # jax.nn.dot_product_attention does not expose dropout.
      attend = functools.partial(
          bert_attention.explicit_attention, rate=cfg.attention_dropout_rate,
          rng=cfg.dropout_rng, length=x_BLD.shape[1], dtype=cfg.dtype)
      extra = (Dropout(cfg.attention_dropout_rate, cfg.dropout_rng).key(), query_positions_BE)
    if cfg.remat == "attention" and not kernel:
      attend = recomputed(attend)
    ctx_BLHK = attend(q_BLHK, k_BMHK, v_BMHK, bias_B11M, *extra)
    return _Projection(cfg, (cfg.hidden_size,), ("heads", "kv", "embed"), contract=2,
                       name="output")(ctx_BLHK)


class EncoderLayer(nn.Module):
  """Post-LN Transformer layer: attention and FFN, each dropout -> residual -> LN.

  With `query_positions_BE` [B, E] the layer computes only those rows of its output
  ([B, E, D]; attention still reads the whole sequence): what a classifier on the
  last layer's [CLS] needs, at a fraction of the cost. Same values as the rows of
  the full output, dropout masks included.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x_BLD, bias_B11M, deterministic: bool, query_positions_BE=None):
    cfg = self.config
    x_BLD = nn.with_logical_constraint(
        x_BLD, ("activation_batch", "activation_length", "activation_embed"))
    rows = None if query_positions_BE is None else Rows(1, query_positions_BE, x_BLD.shape[1])
    h_BLD = SelfAttention(cfg, name="attention")(x_BLD, bias_B11M, deterministic, query_positions_BE)
    h_BLD = Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)(h_BLD, deterministic=deterministic,
                                                              rows=rows)
    x_BLD = _layer_norm(cfg, "attention_LayerNorm")(
        take_rows(x_BLD, query_positions_BE, 1) + h_BLD)
    h_BLF = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate", True)(x_BLD)
    h_BLF = ACTIVATIONS[cfg.hidden_act](h_BLF)
    h_BLF = nn.with_logical_constraint(
        h_BLF, ("activation_batch", "activation_length", "activation_mlp"))
    h_BLD = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output", True)(h_BLF)
    h_BLD = Dropout(cfg.hidden_dropout_rate, cfg.dropout_rng)(h_BLD, deterministic=deterministic,
                                                              rows=rows)
    return _layer_norm(cfg, "output_LayerNorm")(x_BLD + h_BLD)


class _ScannedLayer(EncoderLayer):
  """EncoderLayer with the (carry, _) -> (carry, _) signature nn.scan wants."""

  def __call__(self, x_BLD, bias_B11M, deterministic: bool):
    return super().__call__(x_BLD, bias_B11M, deterministic), None


class Encoder(nn.Module):
  """`num_layers` layers, unrolled (`layer_{i}`) or under nn.scan (`layers`).

  With `last_positions_BE`, the output is only those rows of the last layer's output
  ([B, E, D]); unrolled, the last layer computes no other rows.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x_BLD, bias_B11M, deterministic: bool, last_positions_BE=None,
               all_layers: bool = False):
    """`all_layers`: every hidden state, [input, layer 1, ..., layer N] (unrolled layers)."""
    cfg = self.config
    layer_cls = layer_stack(cfg, EncoderLayer, _ScannedLayer, static_argnums=(3,),
                            scan_static_argnums=(3,), in_axes=(nn.broadcast, nn.broadcast),
                            all_layers=all_layers)
    if cfg.scan_layers:
      x_BLD, _ = layer_cls(cfg, name="layers")(x_BLD, bias_B11M, deterministic)
      return take_rows(x_BLD, last_positions_BE, 1)  # every layer runs on every row here
    hidden = [x_BLD]
    for i in range(cfg.num_layers):
      last = i == cfg.num_layers - 1
      x_BLD = layer_cls(cfg, name=f"layer_{i}")(x_BLD, bias_B11M, deterministic,
                                                  last_positions_BE if last else None)
      hidden.append(x_BLD)
    return hidden if all_layers else x_BLD


class BertModel(nn.Module):
  """The BERT encoder: returns (sequence_output [B, L, D], pooled_output [B, D]).

  `add_pooler=False` leaves out the pooler (as HuggingFace's BertForMaskedLM does); the
  pooled output is then None. `pooled_only=True` is for heads that read the pooled
  output alone (sequence classification, multiple choice): the last layer then computes
  only the [CLS] rows (all-MiniLM-L6 at L=64: 14% fewer FLOPs per train step; unrolled
  layers only, scan_layers computes every row) and the sequence output is None. The
  pooled output is the same as without it, dropout masks included.
  """
  config: BertConfig
  add_pooler: bool = True
  pooled_only: bool = False
  # Another encoder whose embeddings this one reads and whose word embeddings its output
  # attends (ELECTRA's generator shares the discriminator's: bert_jax/models/electra.py); None: its
  # own. The embeddings projection, if any, stays this encoder's.
  embeddings_of: nn.Module | None = None

  def setup(self):
    cfg = self.config
    if self.embeddings_of is None:
      self.embeddings = Embeddings(cfg)
    if cfg.embedding_dim != cfg.hidden_size:
      self.embeddings_project = dense(cfg, cfg.hidden_size, (None, "embed"), "embeddings_project")
    self.encoder = Encoder(cfg)
    if self.add_pooler:
      self.pooler = dense(cfg, cfg.hidden_size, ("embed", None), "pooler")

  def embed(self, input_ids, segment_ids, position_ids, deterministic):
    """The embeddings layer's output, [B, L, embedding_dim] (before any projection)."""
    if self.embeddings_of is not None:
      return self.embeddings_of.embed(input_ids, segment_ids, position_ids, deterministic)
    return self.embeddings(input_ids, segment_ids, position_ids, deterministic)

  def _embed(self, input_ids, segment_ids, position_ids, deterministic):
    x = self.embed(input_ids, segment_ids, position_ids, deterministic)
    return self.embeddings_project(x) if self.config.embedding_dim != self.config.hidden_size else x

  def _pool(self, cls_BD):
    act = jnp.tanh if self.config.pooler_act == "tanh" else ACTIVATIONS[self.config.pooler_act]
    return act(self.pooler(cls_BD))

  def __call__(self, input_ids, segment_ids=None, input_mask=None, deterministic: bool = True,
               position_ids=None, packed_example_ids=None, cls_positions=None,
               rows_at=None):
    """Packed rows (several examples in one row) pass `packed_example_ids` [B, L]
    (1, 2, ... per example, 0 = padding: attention stays inside an example),
    `position_ids` restarting at each example, and `cls_positions` [B, E]; the
    pooled output is then [B, E, D], one per example's [CLS].

    `rows_at` [B, K]: the sequence output only at these positions ([B, K, D], as
    gather_positions of the full output), the last layer computing no other rows than
    them and the pooler's [CLS] (keys and values still from every position; unrolled
    layers only, scan_layers computes every row): what pre-training's heads read."""
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_length:
      raise errors.ConfigError(
          f"Sequence length {length} exceeds the position table "
          f"(max_position_embeddings={cfg.max_position_embeddings}"
          + (f", from position {cfg.position_offset}" if cfg.position_offset else "")
          + f"). Truncate the input to {cfg.max_length} tokens or use a model with more "
          "positions.")
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    x_BLD = self._embed(input_ids, segment_ids, position_ids, deterministic)
    bias, last = self._bias(input_mask, packed_example_ids, cls_positions, length)
    if (self.pooled_only or rows_at is not None) and self.add_pooler:
      cls_BE = jnp.zeros((batch, 1), jnp.int32) if cls_positions is None else cls_positions
      cls_BE = cls_BE if last is None else last
      e = cls_BE.shape[1]
      wanted_BK = cls_BE if rows_at is None else jnp.concatenate(
          [cls_BE, rows_at.astype(jnp.int32)], axis=1)
      out_BKD = self.encoder(x_BLD, bias, deterministic, last_positions_BE=wanted_BK)
      cls_BD = out_BKD[:, 0] if cls_positions is None or last is not None else out_BKD[:, :e]
      return (None if rows_at is None else out_BKD[:, e:]), self._pool(cls_BD)
    if rows_at is not None:
      return self.encoder(x_BLD, bias, deterministic,
                          last_positions_BE=rows_at.astype(jnp.int32)), None
    x_BLD = self.encoder(x_BLD, bias, deterministic)
    if not self.add_pooler:
      return x_BLD, None
    if last is not None:
      cls_BD = gather_positions(x_BLD, last)[:, 0]
    else:
      cls_BD = x_BLD[:, 0] if cls_positions is None else gather_positions(x_BLD, cls_positions)
    pooled_BD = self._pool(cls_BD)
    return x_BLD, pooled_BD

  def _bias(self, input_mask, packed_example_ids, cls_positions, length: int):
    """(the additive attention bias, each row's last real token [B, 1] for a left-to-right
    model (what its pooled output reads) or None)."""
    cfg = self.config
    if packed_example_ids is None:
      bias = attention_bias(input_mask, cfg.dtype)
    else:
      bias = packed_attention_bias(packed_example_ids, cfg.dtype)
    if not cfg.causal:
      return bias, None
    bias = jnp.minimum(bias, causal_bias(length, cfg.dtype))
    if self.add_pooler and cls_positions is not None:
      raise errors.ConfigError("A left-to-right model (causal) pools each input's last token; "
                               "packed fine-tuning pools [CLS]: set --config.packing=False.")
    # The last real token sees the whole input: the pooled output is its.
    return bias, jnp.maximum(jnp.sum(input_mask, -1).astype(jnp.int32) - 1, 0)[:, None]

  def hidden_states(self, input_ids, segment_ids, input_mask, deterministic: bool = True
                    ) -> list[jax.Array]:
    """[embeddings, layer 1, ..., layer N] outputs, each [B, L, D] (what feature-based
    fine-tuning and predict's features read; the pooler is not used)."""
    cfg = self.config
    batch, length = input_ids.shape
    position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    x_BLD = self._embed(input_ids, segment_ids, position_ids, deterministic)
    bias = attention_bias(input_mask, cfg.dtype)
    if cfg.causal:
      bias = jnp.minimum(bias, causal_bias(length, cfg.dtype))
    return self.encoder(x_BLD, bias, deterministic, all_layers=True)

  def tokens(self, x_BLD):
    """What a token-level head reads from the sequence output: the output itself."""
    return x_BLD

  def attend_vocab(self, x_BPD):
    """Logits against the (tied) word-embedding matrix."""
    if self.embeddings_of is not None:
      return self.embeddings_of.attend_vocab(x_BPD)
    return self.embeddings.word_embeddings.attend(x_BPD)


class BertForPreTraining(nn.Module):
  """Encoder + masked-LM head (at gathered positions only) + NSP head.

  `nsp=False` is the masked-LM-only model (HuggingFace's BertForMaskedLM): no NSP head and
  no pooler (which only the NSP head reads in pre-training); outputs then hold no
  "nsp_logits" and `objectives.pretraining_loss` is the masked-LM loss alone.
  """
  config: BertConfig
  nsp: bool = True
  embeddings_of: nn.Module | None = None  # BertModel.embeddings_of
  # The last layer only at the rows the heads read (masked positions, [CLS]) when they are
  # fewer than the sequence: the same outputs and gradients (tests/test_model.py).
  head_rows: bool = True

  def setup(self):
    cfg = self.config
    self.bert = BertModel(cfg, add_pooler=self.nsp, embeddings_of=self.embeddings_of)
    self.transform = dense(cfg, cfg.embedding_dim, ("embed", None), "transform")
    self.transform_LayerNorm = _layer_norm(cfg, "transform_LayerNorm")
    self.output_bias = self.param("output_bias", _zeros(("vocab",)), (cfg.vocab_size,),
                                  cfg.param_dtype)
    if self.nsp:
      self.seq_relationship = dense(cfg, 2, ("embed", None), "seq_relationship")

  def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions,
               deterministic: bool = True, position_ids=None, packed_example_ids=None,
               cls_positions=None) -> dict[str, jax.Array]:
    cfg = self.config
    rows = self.head_rows and masked_lm_positions.shape[1] < input_ids.shape[1]
    seq_BLD, pooled_BD = self.bert(input_ids, segment_ids, input_mask, deterministic,
                                   position_ids=position_ids, packed_example_ids=packed_example_ids,
                                   cls_positions=cls_positions,
                                   rows_at=masked_lm_positions if rows else None)
    # Only the P masked positions reach the vocabulary projection (P << L).
    h_BPD = seq_BLD if rows else gather_positions(seq_BLD, masked_lm_positions)
    h_BPD = self.transform_LayerNorm(ACTIVATIONS[cfg.hidden_act](self.transform(h_BPD)))
    logits_BPV = self.bert.attend_vocab(h_BPD).astype(jnp.float32)
    logits_BPV = logits_BPV + jnp.asarray(self.output_bias, jnp.float32)
    if not self.nsp:
      return {"mlm_logits": logits_BPV}
    nsp_logits_B2 = self.seq_relationship(pooled_BD).astype(jnp.float32)
    return {"mlm_logits": logits_BPV, "nsp_logits": nsp_logits_B2}


class BertForCausalLM(BertForPreTraining):
  """The left-to-right LM of the paper's ablation (Table 5, "LTR & No NSP"): a causal
  encoder (`config.causal`) with the masked-LM head at every position, where position t
  predicts token t+1 (objectives.ltr). Its parameters are BertForPreTraining(nsp=False)'s, so
  its checkpoints fine-tune, convert and export like any masked-LM model's."""
  nsp: bool = False

  def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
               position_ids=None, packed_example_ids=None, cls_positions=None
               ) -> dict[str, jax.Array]:
    every = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    return super().__call__(input_ids, segment_ids, input_mask, every, deterministic,
                            position_ids, packed_example_ids, cls_positions)


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


# ----------------------------------------------------------------------------
# Model FLOPs (the Family record's forward_flops).

def forward_flops(cfg: ModelConfig, seq_len: int, num_predictions: int, nsp: bool = True,
                       last_rows: int | None = None) -> int:
  """Matmul FLOPs of one forward pass over one sequence (flops.forward_flops_per_sequence):
  `last_rows`: the last layer computes only that many rows (model.BertModel's
  `rows_at`: the heads' positions), its keys and values still at every position."""
  L, D, F, V, P = seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, num_predictions
  E = cfg.embedding_dim  # the embedding width (ELECTRA's may be narrower: projected to D)

  def layer(rows: int) -> int:
    return (2 * L * D * 2 * D + 2 * rows * D * D  # k, v projections at L; q at the rows
            + 2 * rows * L * D  # scores q.k of the rows' queries over all L keys (all heads)
            + 2 * rows * L * D  # probabilities x values
            + 2 * rows * D * D  # attention output projection
            + 2 * rows * D * F * 2)  # feed-forward in and out
  last = layer(L if last_rows is None else min(last_rows, L))
  mlm = 2 * P * D * E + 2 * P * E * V  # transform + tied vocabulary projection at P positions
  pooler_nsp = (2 * D * D + 2 * D * 2) if nsp else 0  # pooler + classifier
  project = 2 * L * E * D if E != D else 0  # embeddings_project
  return project + (cfg.num_layers - 1) * layer(L) + last + mlm + pooler_nsp
