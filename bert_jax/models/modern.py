"""The modern encoder generation in Flax linen: ModernBERT's architecture (ModernBERT, Ettin,
mmBERT) and EuroBERT's, one module set with the differences as config.

Both are pre-norm Transformers without absolute positions: token embeddings (ModernBERT:
then a bias-free LayerNorm), layers of [norm -> attention with rotary positions -> residual,
norm -> gated MLP (GeGLU / SwiGLU) -> residual], a final norm. ModernBERT alternates global
layers with sliding-window (local) layers, each kind with its own rope theta, and drops the
first layer's pre-attention norm; EuroBERT uses RMSNorm, SwiGLU and grouped-query attention,
every layer global. Numerics follow transformers' `ModernBertModel` / `EuroBertModel`
(tests/test_modern.py checks them in float32).

The attention computations are in modern_attention.py (their names importable from here
too): local layers compute only their band (`attention="banded"`, cost L x window, not
L x L), `attention="dense"` the same with a full L x L mask (the reference). Packed rows
(several examples in one row) attend within their example in both.

Axis legend as in bert.py, plus G = key/value heads (grouped-query attention).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.models import layers
from bert_jax.models.modern_attention import (allowed_keys, banded_attention, dense_attention,
                                              flash_attention, packed_global_attention, rope,
                                              splash_attention)
from common import errors

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types names
PLAIN_ACTIVATIONS = {"gelu": layers.gelu, "gelu_tanh": layers.gelu_tanh, "silu": jax.nn.silu,
                     "relu": jax.nn.relu}
# The heads' (the GELUs recomputed, as layers.ACTIVATIONS'), and the MLP's act(gate) * up.
ACTIVATIONS = {name: layers.ACTIVATIONS.get(name, act) for name, act in PLAIN_ACTIVATIONS.items()}
GATED = {name: layers.gated(act) for name, act in PLAIN_ACTIVATIONS.items()}
NORMS = ("layernorm", "rmsnorm")
POOLINGS = ("cls", "mean", "late")  # "late": EuroBERT's mean of per-token head outputs
ATTENTIONS = ("banded", "dense", "splash", "flash")  # flash: bert_jax.flash (Pallas; GPU)

# Published sizes (vocabulary, layers, hidden, heads, intermediate; the rest from the family's
# defaults). A published preset keeps its (padded) vocabulary size, so that its checkpoint
# loads with its own tokenizer; the tiny ones take the vocabulary's.
PRESETS: dict[str, dict[str, Any]] = {
    "modernbert-base": dict(vocab_size=50368, num_layers=22, hidden_size=768, num_heads=12,
                            intermediate_size=1152),
    "modernbert-large": dict(vocab_size=50368, num_layers=28, hidden_size=1024, num_heads=16,
                             intermediate_size=2624),
    # Ettin encoders (ModernBERT architecture, 2025).
    "ettin-17m": dict(vocab_size=50368, num_layers=7, hidden_size=256, num_heads=4,
                      intermediate_size=384),
    "ettin-32m": dict(vocab_size=50368, num_layers=10, hidden_size=384, num_heads=6,
                      intermediate_size=576),
    "ettin-68m": dict(vocab_size=50368, num_layers=19, hidden_size=512, num_heads=8,
                      intermediate_size=768),
    "ettin-150m": dict(vocab_size=50368, num_layers=22, hidden_size=768, num_heads=12,
                       intermediate_size=1152),
    "ettin-400m": dict(vocab_size=50368, num_layers=28, hidden_size=1024, num_heads=16,
                       intermediate_size=2624),
    "ettin-1b": dict(vocab_size=50368, num_layers=28, hidden_size=1792, num_heads=28,
                     intermediate_size=3840),
    # mmBERT (ModernBERT architecture, Gemma 2 vocabulary).
    "mmbert-small": dict(vocab_size=256000, num_layers=22, hidden_size=384, num_heads=6,
                         intermediate_size=1152),
    "mmbert-base": dict(vocab_size=256000, num_layers=22, hidden_size=768, num_heads=12,
                        intermediate_size=1152),
    "eurobert-210m": dict(family="eurobert", vocab_size=128256, num_layers=12, hidden_size=768,
                          num_heads=12, intermediate_size=3072),
    # Tiny shapes of each family for tests and the built-in corpus.
    "modernbert-tiny": dict(num_layers=3, hidden_size=128, num_heads=2, intermediate_size=192,
                            local_window=16, max_position_embeddings=512),
    "eurobert-tiny": dict(family="eurobert", num_layers=2, hidden_size=128, num_heads=4,
                          num_kv_heads=2, intermediate_size=256, max_position_embeddings=512),
}

# What differs between the two architectures (ModernConfig's own defaults are ModernBERT's).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "modernbert": {},
    "eurobert": dict(vocab_size=128256, hidden_act="silu", norm="rmsnorm", embedding_norm=False,
                     first_attn_norm=True, global_every=1, rope_theta=250000.0,
                     head_norm=False, head_bias=True, head_tokens=False, tie_word_embeddings=False,
                     decoder_bias=False, classifier_pooling="late"),
}


@dataclasses.dataclass(frozen=True)
class ModernConfig(layers.ModelConfig):
  """Everything that defines a ModernBERT- or EuroBERT-architecture network."""
  family: str = "modernbert"  # "modernbert" (ModernBERT, Ettin, mmBERT) | "eurobert"
  vocab_size: int = 50368
  hidden_size: int = 768
  num_layers: int = 22
  num_heads: int = 12
  num_kv_heads: int = 0  # grouped-query attention (EuroBERT); 0 = num_heads
  intermediate_size: int = 1152  # of each half of the gated MLP
  hidden_act: str = "gelu"  # the MLP's gate: "gelu" (GeGLU, exact erf) | "silu" (SwiGLU)
  norm: str = "layernorm"  # "layernorm" | "rmsnorm"
  norm_eps: float = 1e-5
  norm_bias: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  embedding_norm: bool = True  # a norm right after the token embeddings
  first_attn_norm: bool = False  # layer 0 normalises its attention input (ModernBERT: no)
  global_every: int = 3  # layer i is global when i % global_every == 0, else local
  local_window: int = 128  # a local layer's query sees keys within local_window // 2 of it
  rope_theta: float = 160000.0  # global layers
  local_rope_theta: float = 10000.0  # local layers
  max_position_embeddings: int = 8192
  # The prediction head (dense -> act -> norm): ModernBERT's, read by the masked LM and by
  # every fine-tuning head (`head_tokens`); EuroBERT's (dense -> gelu) only by the pooled one.
  head_norm: bool = True
  head_bias: bool = False
  head_act: str = "gelu"
  head_tokens: bool = True  # the token-level heads (MLM, tagging, spans) read the head's output
  tie_word_embeddings: bool = True
  decoder_bias: bool = True
  classifier_pooling: str = "cls"  # "cls" | "mean" | "late" (EuroBERT)
  embedding_dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  mlp_dropout_rate: float = 0.0
  classifier_dropout_rate: float = 0.0
  initializer_range: float = 0.02
  initializer_cutoff_factor: float = 2.0
  dtype: Any = "float32"
  param_dtype: Any = "float32"
  remat: str = "none"  # as BertConfig.remat
  scan_layers: bool = False
  # "banded": XLA, local layers over their band only; "dense": XLA, masked L x L everywhere
  # (the reference); "splash": the Pallas splash-attention kernel (TPU; interpreted
  # elsewhere, for tests) with segment ids, local layers as its local mask.
  attention: str = "banded"
  attention_impl: str | None = None  # global layers: jax.nn.dot_product_attention's (when set)
  # Global layers over packed rows (banded attention): compute only the blocks of
  # `global_block` tokens that share an example, within a static budget of this share of
  # all block pairs (a batch needing more runs dense); 0 = always dense.
  global_block_budget: float = 0.0
  global_block: int = 128
  dropout_rng: str = "hash"
  causal: bool = False  # not used by these families; present for the jobs' checks
  # The tokenizer's special ids, kept for the config.json of an export (None: unknown).
  pad_token_id: int | None = None
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  cls_token_id: int | None = None
  sep_token_id: int | None = None
  mask_token_id: int | None = None

  def __post_init__(self):
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    if self.attention_impl == "explicit":  # as BERT's: XLA's attention, the default
      object.__setattr__(self, "attention_impl", None)
    checks = [
        (self.attention_impl in (None, "xla", "cudnn"), f"attention_impl "
         f"{self.attention_impl!r} unknown for the global layers: choose xla or cudnn, or "
         "leave it unset (model.attention picks the Pallas kernels: flash)."),
        (self.family in FAMILY_DEFAULTS, f"family {self.family!r} unknown; choose one of "
         f"{sorted(FAMILY_DEFAULTS)}."),
        (self.hidden_size % self.num_heads == 0, f"hidden_size {self.hidden_size} is not "
         f"divisible by num_heads {self.num_heads}."),
        (self.num_heads % self.kv_heads == 0, f"num_heads {self.num_heads} is not a multiple "
         f"of num_kv_heads {self.num_kv_heads}."),
        (self.hidden_act in GATED, f"hidden_act {self.hidden_act!r} unknown; choose one "
         f"of {sorted(GATED)}."),
        (self.head_act in ACTIVATIONS, f"head_act {self.head_act!r} unknown; choose one of "
         f"{sorted(ACTIVATIONS)}."),
        (self.norm in NORMS, f"norm {self.norm!r} unknown; choose one of {NORMS}."),
        (self.classifier_pooling in POOLINGS, f"classifier_pooling "
         f"{self.classifier_pooling!r} unknown; choose one of {POOLINGS}."),
        (self.attention in ATTENTIONS, f"attention {self.attention!r} unknown; choose one of "
         f"{ATTENTIONS}."),
        (self.remat in layers.REMAT_POLICIES, f"remat {self.remat!r} unknown; choose one "
         f"of {sorted(layers.REMAT_POLICIES)}."),
        (self.dropout_rng in layers.DROPOUT_RNGS, f"dropout_rng {self.dropout_rng!r} "
         f"unknown; choose one of {layers.DROPOUT_RNGS}."),
        (self.global_every >= 1 and self.local_window >= 2, "global_every must be >= 1 and "
         "local_window >= 2."),
        (not self.causal, "ModernBERT/EuroBERT models are bidirectional (causal=False)."),
    ]
    for ok, message in checks:
      if not ok:
        raise errors.ConfigError(message + " (config.model, or the checkpoint's config.json)")

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "ModernConfig":
    sizes = families.preset_sizes(PRESETS, name, "model")
    family = overrides.get("family", sizes.pop("family", "modernbert"))
    return cls(**{**FAMILY_DEFAULTS[family], **sizes, **overrides, "family": family})

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def hidden_dropout_rate(self) -> float:
    """The fine-tuning heads' dropout before their classifier."""
    return self.classifier_dropout_rate

  @property
  def type_vocab_size(self) -> int:
    return 0  # no segment embeddings: pairs are told apart by their separator alone

  def is_global(self, layer: int) -> bool:
    return layer % self.global_every == 0

  @property
  def layer_types(self) -> tuple[str, ...]:
    return tuple(GLOBAL if self.is_global(i) else LOCAL for i in range(self.num_layers))


def config_from_fields(fields: Mapping[str, Any], vocab_size: int | None = None,
                       family: str = "modernbert") -> ModernConfig:
  """A config's `model` section (a preset + overrides; None = the preset's value) ->
  ModernConfig of `family`; `vocab_size` is the vocabulary's, used when the fields leave it
  unset (a preset's own vocabulary size is kept only when no vocabulary is given)."""
  overrides = {k: v for k, v in fields.items()
               if k not in ("preset", "family") and v is not None}
  unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ModernConfig)})
  if unknown:
    raise errors.ConfigError(
        f"config.model sets {', '.join(unknown)}, which a {family} model does not have (BERT's "
        f"fields?); a {family} config.model takes: "
        f"{', '.join(f.name for f in dataclasses.fields(ModernConfig))}.")
  preset = fields.get("preset") or f"{family}-tiny"
  if preset not in PRESETS:
    raise errors.ConfigError(f"config.model.preset={preset!r} is not a {family} preset; "
                             f"choose one of {sorted(PRESETS)}.")
  if "vocab_size" not in overrides and vocab_size is not None:
    overrides["vocab_size"] = max(vocab_size, PRESETS[preset].get("vocab_size", 0))
  elif vocab_size is not None and overrides["vocab_size"] < vocab_size:
    raise errors.ConfigError(f"config.model.vocab_size={overrides['vocab_size']} is smaller "
                             f"than the vocabulary ({vocab_size} entries).")
  return ModernConfig.from_preset(preset, family=family, **overrides)


# ----------------------------------------------------------------------------
# Layers.

def _init(cfg: ModernConfig, axes: tuple, std: float | None = None):
  """transformers' ModernBERT init: normal(0, std) truncated at +-cutoff std."""
  std = cfg.initializer_range if std is None else std
  cut = cfg.initializer_cutoff_factor

  def init(key, shape, dtype=jnp.float32):
    return std * jax.random.truncated_normal(key, -cut, cut, shape, dtype)
  return nn.with_logical_partitioning(init, axes)


def _out_std(cfg: ModernConfig) -> float:
  return cfg.initializer_range / math.sqrt(2.0 * cfg.num_layers)


def _norm(cfg: ModernConfig, name: str) -> nn.Module:
  ones = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  if cfg.norm == "rmsnorm":
    return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      scale_init=ones, name=name)
  return nn.LayerNorm(epsilon=cfg.norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      use_bias=cfg.norm_bias, scale_init=ones,
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             ("embed",)), name=name)


class _Linear(nn.Module):
  """x @ kernel (+ bias) over the trailing `contract` dims of x; kernel [in..., out...]."""
  config: ModernConfig
  features: tuple[int, ...]
  axes: tuple[str | None, ...]
  use_bias: bool
  std: float | None = None
  contract: int = 1

  @nn.compact
  def __call__(self, x):
    cfg, n = self.config, self.contract
    kernel = self.param("kernel", _init(cfg, self.axes, self.std),
                        x.shape[-n:] + tuple(self.features), cfg.param_dtype)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=cfg.dtype)
    y = jax.lax.dot_general(x, kernel, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))),
                                        ((), ())))
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             self.axes[n:]),
                        tuple(self.features), cfg.param_dtype)
      y = y + bias.astype(cfg.dtype)
    return y


def _fused_kernel(cfg: ModernConfig, glob: bool, rate: float, packed: bool):
  """The fused kernel a global (`glob`) or local layer attends with, called as
  (q, k, v, segment_ids, dropout key) -> context, or None where XLA's attention runs. No
  kernel keeps an L x M tensor for the backward pass (nothing for remat=attention)."""
  window = None if glob else cfg.local_window // 2
  if cfg.attention == "flash" and (rate == 0 or cfg.dropout_rng == "hash"):
    return lambda q, k, v, seg, key: flash_attention(q, k, v, seg, window, rate, key)
  if cfg.attention == "splash" and rate == 0:
    return lambda q, k, v, seg, key: splash_attention(q, k, v, seg, window, cfg.dtype)
  packed_global = packed and cfg.attention == "banded" and cfg.global_block_budget > 0
  if glob and rate == 0 and cfg.attention_impl == "cudnn" and not packed_global:
    def cudnn(q, k, v, seg, key):
      del key
      mask = allowed_keys(seg, seg, None, None, None)[:, None]
      return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")
    return cudnn
  return None


class Attention(nn.Module):
  """Multi-head (grouped-query) self-attention with rotary positions; global or local."""
  config: ModernConfig

  @nn.compact
  def __call__(self, x_BLD, segment_ids_BL, positions_BL, is_global, deterministic,
               packed: bool = False):
    cfg = self.config
    h, g, k = cfg.num_heads, cfg.kv_heads, cfg.head_dim
    proj = lambda heads, name: _Linear(cfg, (heads, k), ("embed", "heads", "kv"),
                                       cfg.attention_bias, name=name)(x_BLD)
    q_BLHK, k_BLGK, v_BLGK = proj(h, "query"), proj(g, "key"), proj(g, "value")
    q_BLHK = nn.with_logical_constraint(
        q_BLHK, ("activation_batch", "activation_length", "activation_heads", "activation_kv"))
    rate = 0.0 if deterministic else cfg.attention_dropout_rate
    key = self.make_rng("dropout") if rate > 0 else None  # here: kinds may be lax.cond branches

    def attend(glob: bool, q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, positions_BL, key):
      drop = None if key is None else (
          lambda p: layers.dropout(p, rate, key, cfg.dropout_rng))
      theta = cfg.rope_theta if glob else cfg.local_rope_theta
      q, kk = rope(q_BLHK, positions_BL, theta), rope(k_BLGK, positions_BL, theta)
      kernel = _fused_kernel(cfg, glob, rate, packed)
      if kernel is not None:
        return kernel(q, kk, v_BLGK, segment_ids_BL, key)
      if glob and packed and drop is None and cfg.attention == "banded" and (
          cfg.global_block_budget > 0):
        return packed_global_attention(q, kk, v_BLGK, segment_ids_BL, cfg.dtype,
                                       cfg.global_block, cfg.global_block_budget)
      if glob:
        if drop is None and cfg.attention_impl:  # "xla" (cuDNN is a fused kernel)
          mask = allowed_keys(segment_ids_BL, segment_ids_BL, None, None, None)[:, None]
          return jax.nn.dot_product_attention(q, kk, v_BLGK, mask=mask,
                                              implementation=cfg.attention_impl)
        return dense_attention(q, kk, v_BLGK, segment_ids_BL, None, cfg.dtype, drop)
      fn = dense_attention if cfg.attention == "dense" else banded_attention
      return fn(q, kk, v_BLGK, segment_ids_BL, cfg.local_window // 2, cfg.dtype, drop)

    def attention(glob: bool):
      fn = functools.partial(attend, glob)
      if cfg.remat == "attention" and _fused_kernel(cfg, glob, rate, packed) is None:
        fn = layers.recomputed(fn)  # XLA's attention: recompute its L x M tensors
      return fn(q_BLHK, k_BLGK, v_BLGK, segment_ids_BL, positions_BL, key)

    if isinstance(is_global, bool):
      ctx_BLHK = attention(is_global)
    else:  # scanned layers: the kind is a traced flag
      ctx_BLHK = jax.lax.cond(is_global, lambda: attention(True), lambda: attention(False))
    out = _Linear(cfg, (cfg.hidden_size,), ("heads", "kv", "embed"), cfg.attention_bias,
                  std=_out_std(cfg), contract=2, name="output")(ctx_BLHK)
    return layers.Dropout(cfg.attention_dropout_rate, cfg.dropout_rng)(
        out, deterministic=deterministic)


class MLP(nn.Module):
  """Gated MLP: down(act(gate(x)) * up(x)) (GeGLU / SwiGLU)."""
  config: ModernConfig

  @nn.compact
  def __call__(self, x_BLD, deterministic):
    cfg = self.config
    lin = lambda f, axes, name, std=None: _Linear(cfg, (f,), axes, cfg.mlp_bias, std=std,
                                                  name=name)
    gate_BLF = lin(cfg.intermediate_size, ("embed", "mlp"), "gate")(x_BLD)
    up_BLF = lin(cfg.intermediate_size, ("embed", "mlp"), "up")(x_BLD)
    h_BLF = GATED[cfg.hidden_act](gate_BLF, up_BLF)
    h_BLF = nn.with_logical_constraint(
        h_BLF, ("activation_batch", "activation_length", "activation_mlp"))
    h_BLF = layers.Dropout(cfg.mlp_dropout_rate, cfg.dropout_rng)(h_BLF, deterministic)
    return lin(cfg.hidden_size, ("mlp", "embed"), "down", _out_std(cfg))(h_BLF)


class Layer(nn.Module):
  """Pre-norm layer: x + attn(norm(x)), then x + mlp(norm(x)). `layer` is its index: a
  Python int unrolled, traced under scan (the layer's kind is then a traced flag). Every
  layer holds an attention norm, so that the layers stack for scan in either layout;
  ModernBERT's first layer leaves its own unread (transformers has none there)."""
  config: ModernConfig

  @nn.compact
  def __call__(self, x_BLD, segment_ids_BL, positions_BL, layer, deterministic: bool,
               packed: bool = False):
    cfg = self.config
    x_BLD = nn.with_logical_constraint(
        x_BLD, ("activation_batch", "activation_length", "activation_embed"))
    h_BLD = _norm(cfg, "attn_norm")(x_BLD)
    if isinstance(layer, int):
      is_global = cfg.is_global(layer)
      if layer == 0 and not cfg.first_attn_norm:
        h_BLD = x_BLD
    else:
      is_global = layer % cfg.global_every == 0
      if not cfg.first_attn_norm:
        h_BLD = jnp.where(layer == 0, x_BLD, h_BLD)
    x_BLD = x_BLD + Attention(cfg, name="attention")(h_BLD, segment_ids_BL, positions_BL,
                                                      is_global, deterministic, packed)
    return x_BLD + MLP(cfg, name="mlp")(_norm(cfg, "mlp_norm")(x_BLD), deterministic)


class _ScannedLayer(Layer):
  """Layer with the (carry, layer index) -> (carry, None) signature nn.scan wants."""

  def __call__(self, x_BLD, segment_ids_BL, positions_BL, deterministic: bool, packed: bool,
               layer):
    return super().__call__(x_BLD, segment_ids_BL, positions_BL, layer, deterministic,
                            packed), None


class Encoder(nn.Module):
  """`num_layers` layers, unrolled (`layer_{i}`) or under nn.scan (`layers`, the layer's
  index scanned over: its kind is then chosen by a traced flag)."""
  config: ModernConfig

  @nn.compact
  def __call__(self, x_BLD, segment_ids_BL, positions_BL, deterministic: bool,
               packed: bool = False, all_layers: bool = False):
    """`all_layers`: every hidden state, [input, layer 1, ..., layer N] (unrolled layers)."""
    cfg = self.config
    layer = layers.layer_stack(cfg, Layer, _ScannedLayer, static_argnums=(4, 5, 6),
                               scan_static_argnums=(4, 5), all_layers=all_layers,
                               in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, 0))
    if cfg.scan_layers:
      x_BLD, _ = layer(cfg, name="layers")(x_BLD, segment_ids_BL, positions_BL, deterministic,
                                           packed, jnp.arange(cfg.num_layers))
      return x_BLD
    hidden = [x_BLD]
    for i in range(cfg.num_layers):
      x_BLD = layer(cfg, name=f"layer_{i}")(x_BLD, segment_ids_BL, positions_BL, i, deterministic,
                                            packed)
      hidden.append(x_BLD)
    return hidden if all_layers else x_BLD


class Head(nn.Module):
  """dense -> act (-> norm): ModernBERT's prediction head, EuroBERT's classifier dense."""
  config: ModernConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = _Linear(cfg, (cfg.hidden_size,), ("embed", None), cfg.head_bias, std=_out_std(cfg),
                name="dense")(x)
    x = ACTIVATIONS[cfg.head_act](x)
    return _norm(cfg, "norm")(x) if cfg.head_norm else x


class ModernModel(nn.Module):
  """The encoder: returns (final hidden states [B, L, D], pooled output [B, D]) as
  model.BertModel does, the pooled output being the family's: ModernBERT's prediction head
  on the [CLS] state or the mean of the states (`classifier_pooling`), EuroBERT's dense +
  gelu on [CLS] or the mean, or the mean of dense + gelu of every state ("late", the same
  logits as EuroBERT's mean of per-token logits: the classifier is linear). `tokens(x)` is
  what token-level heads read (ModernBERT: the prediction head; EuroBERT: x).

  Inputs as BertModel's; `segment_ids` are accepted and unused (no segment embeddings).
  """
  config: ModernConfig
  add_pooler: bool = True
  pooled_only: bool = False

  def setup(self):
    cfg = self.config
    self.tok_embeddings = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype,
                                   param_dtype=cfg.param_dtype,
                                   embedding_init=_init(cfg, ("vocab", "embed")))
    if cfg.embedding_norm:
      self.embedding_norm = _norm(cfg, "embedding_norm")
    self.embedding_dropout = layers.Dropout(cfg.embedding_dropout_rate, cfg.dropout_rng)
    self.encoder = Encoder(cfg)
    self.final_norm = _norm(cfg, "final_norm")
    if self.add_pooler or cfg.head_tokens:
      self.head = Head(cfg)

  def __call__(self, input_ids, segment_ids=None, input_mask=None, deterministic: bool = True,
               position_ids=None, packed_example_ids=None, cls_positions=None):
    cfg = self.config
    del segment_ids
    batch, length = input_ids.shape
    if length > cfg.max_position_embeddings:
      raise errors.ConfigError(
          f"Sequence length {length} exceeds the model's max_position_embeddings "
          f"({cfg.max_position_embeddings}): truncate the input, or extend the context "
          "(a context-extension phase with a new length and rope theta).")
    if packed_example_ids is not None:
      segments_BL = packed_example_ids.astype(jnp.int32)
    else:
      segments_BL = (jnp.ones_like(input_ids) if input_mask is None
                     else input_mask).astype(jnp.int32)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    x_BLD = self.encoder(self._embed(input_ids, deterministic), segments_BL, position_ids,
                         deterministic, packed_example_ids is not None)
    x_BLD = self.final_norm(x_BLD)
    if not self.add_pooler:
      return x_BLD, None
    pooled = self.pool(x_BLD, segments_BL, cls_positions)
    return (None if self.pooled_only else x_BLD), pooled

  def _embed(self, input_ids, deterministic: bool):
    x_BLD = self.tok_embeddings(input_ids)
    if self.config.embedding_norm:
      x_BLD = self.embedding_norm(x_BLD)
    return self.embedding_dropout(x_BLD, deterministic=deterministic)

  def hidden_states(self, input_ids, segment_ids=None, input_mask=None,
                    deterministic: bool = True) -> list[jax.Array]:
    """[embeddings, layer 1, ..., layer N] outputs, each [B, L, D] (what feature-based
    fine-tuning reads): transformers' output_hidden_states, except that the last is after the
    final norm (the model's output, as BertModel.hidden_states' last is)."""
    del segment_ids
    batch, length = input_ids.shape
    segments_BL = (jnp.ones_like(input_ids) if input_mask is None else input_mask).astype(jnp.int32)
    positions_BL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    hidden = self.encoder(self._embed(input_ids, deterministic), segments_BL, positions_BL,
                          deterministic, all_layers=True)
    return hidden[:-1] + [self.final_norm(hidden[-1])]

  def pool(self, x_BLD, segments_BL, cls_positions=None):
    """[B, D] (or [B, E, D] for packed rows' E examples) of the family's pooling."""
    cfg = self.config
    if cfg.classifier_pooling == "cls":
      if cls_positions is None:
        return self.head(x_BLD[:, 0])
      return self.head(layers.gather_positions(x_BLD, cls_positions))
    x = self.head(x_BLD) if cfg.classifier_pooling == "late" else x_BLD
    if cls_positions is None:
      w_BLE = (segments_BL > 0)[..., None]
    else:  # example e of a packed row: the tokens of packed example id e + 1
      e = jnp.arange(cls_positions.shape[1], dtype=jnp.int32) + 1
      w_BLE = segments_BL[..., None] == e
    w_BLE = w_BLE.astype(jnp.float32)
    mean_BED = jnp.einsum("BLE,BLD->BED", w_BLE, x.astype(jnp.float32)) / jnp.maximum(
        jnp.sum(w_BLE, 1), 1.0)[..., None]
    mean_BED = mean_BED.astype(x.dtype)
    mean = mean_BED[:, 0] if cls_positions is None else mean_BED
    return mean if cfg.classifier_pooling == "late" else self.head(mean)

  def tokens(self, x_BLD):
    """What a token-level head reads from the final hidden states."""
    return self.head(x_BLD) if self.config.head_tokens else x_BLD

  def attend_vocab(self, x_BPD):
    return self.tok_embeddings.attend(x_BPD)


class ModernForMaskedLM(nn.Module):
  """Encoder + masked-LM head at gathered positions: transformers' ModernBertForMaskedLM
  (prediction head, decoder tied to the embeddings, with a bias) and EuroBertForMaskedLM
  (a linear lm_head on the final states). Outputs {"mlm_logits": [B, P, V]}. Takes
  BertForPreTraining's inputs; there is no next-sentence head (`nsp` must be False)."""
  config: ModernConfig
  nsp: bool = False

  def setup(self):
    cfg = self.config
    if self.nsp:
      raise errors.ConfigError(f"{cfg.family} models have no next-sentence prediction: set "
                               "--config.data.nsp=False.")
    self.bert = ModernModel(cfg, add_pooler=False)
    if cfg.tie_word_embeddings:
      if cfg.decoder_bias:
        self.decoder_bias = self.param(
            "decoder_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
            (cfg.vocab_size,), cfg.param_dtype)
    else:
      self.lm_head = _Linear(cfg, (cfg.vocab_size,), ("embed", "vocab"), cfg.decoder_bias,
                             std=_out_std(cfg))

  def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions,
               deterministic: bool = True, position_ids=None, packed_example_ids=None,
               cls_positions=None) -> dict[str, jax.Array]:
    cfg = self.config
    x_BLD, _ = self.bert(input_ids, segment_ids, input_mask, deterministic,
                         position_ids=position_ids, packed_example_ids=packed_example_ids)
    h_BPD = self.bert.tokens(layers.gather_positions(x_BLD, masked_lm_positions))
    if not cfg.tie_word_embeddings:
      return {"mlm_logits": self.lm_head(h_BPD).astype(jnp.float32)}
    logits_BPV = self.bert.attend_vocab(h_BPD).astype(jnp.float32)
    if cfg.decoder_bias:
      logits_BPV = logits_BPV + jnp.asarray(self.decoder_bias, jnp.float32)
    return {"mlm_logits": logits_BPV}
