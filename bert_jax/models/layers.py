"""The building blocks every model family shares, independent of any one family's config.

The config base class (`ModelConfig`), the activations, remat policies and dropout
generators by name; dropout (`Dropout`, `dropout`, `hash_bits`: the masks bert_jax.flash
draws too) and the rows of a larger array it may be computed on (`Rows`, `take_rows`); the
additive attention biases (padding, packed rows, left-to-right); and the gathers and lookups
of the encoders (`gather_positions`, `one_hot_lookup`). Axis legend as in bert.py.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import flash
from common import errors

# Additive attention bias for padding. Large but finite so a fully padded row
# (only ever at padding queries) stays NaN-free, and safe in bfloat16.
NEG_INF = -1e9


def recomputed(fn):
  """`fn` whose backward pass keeps only its inputs and recomputes everything else from them.
  Attention (remat=attention): the scores, softmax and dropout masks, so no [B, H, L, M]
  tensor outlives the forward pass (Megatron-LM's selective activation recomputation). The
  activations: GELU's tanh or erf, recomputed from its input in the backward pass's own
  fusion instead of written beside its output. The recomputation waits for the incoming
  cotangent (an optimization barrier over both): under jax.checkpoint alone, XLA may schedule
  it early, in the forward pass of unrolled layers, where it keeps what it was meant to drop.
  The same values: it repeats the forward's ops."""
  @jax.custom_vjp
  def run(*args):
    return fn(*args)

  def forward(*args):
    return fn(*args), args

  def backward(args, cotangent):
    args, cotangent = jax.lax.optimization_barrier((args, cotangent))
    return jax.vjp(fn, *args)[1](cotangent)

  run.defvjp(forward, backward)
  return run


def gelu(x: jax.Array) -> jax.Array:
  """The exact (erf) GELU as transformers and torch write it, x/2 (1 + erf(x/sqrt 2)):
  jax.nn.gelu(approximate=False)'s values within float32 rounding (~1e-6), and ~3x cheaper on
  XLA:CPU, where jax's erfc form is a slow path (all-MiniLM-L6-v2's contrastive step: ~5%)."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * (1 / math.sqrt(2))))


def gelu_tanh(x: jax.Array) -> jax.Array:
  """The tanh approximation of GELU (Google's original BERT; transformers' "gelu_new")."""
  return jax.nn.gelu(x, approximate=True)


# The activations by name. The GELUs keep only their input for the backward pass
# (`recomputed`): autodiff would also keep the tanh (erf) of every element, which XLA writes
# beside the output (the GPU step's HLO: one more bf16 [B, L, F] tensor a layer). The same
# values (tests/test_remat.py).
ACTIVATIONS = {
    # Original TF BERT uses the tanh approximation; HuggingFace "gelu" is exact erf.
    "gelu_tanh": recomputed(gelu_tanh),
    "gelu": recomputed(gelu),
    "relu": jax.nn.relu,
}


def gated(act):
  """act(gate) * up (GeGLU, SwiGLU) keeping only gate and up for the backward pass."""
  return recomputed(lambda gate, up: act(gate) * up)


# model.remat -> the policy the layers are rematerialised with ("attention": the layers are
# not; each family recomputes its attention core alone, `recomputed`).
REMAT_POLICIES = {
    "none": None,
    "attention": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

DROPOUT_RNGS = ("hash", "threefry")


class ModelConfig:
  """What every family's frozen config dataclass shares: variants by `.replace(...)`, and a
  dict form (dtypes as strings) that checkpoints record and `from_dict` reads back."""

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)

  @property
  def max_length(self) -> int:
    """The longest input the position table serves."""
    return self.max_position_embeddings

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["dtype"], d["param_dtype"] = str(self.dtype), str(self.param_dtype)
    return d

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]):
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise errors.ConfigError(f"Unknown {cls.__name__} fields {sorted(unknown)}.")
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Rows:
  """Some rows of a larger array: entry e of `axis` is row `positions[b, e]` (of
  `length`) in batch element b. The last layer of a pooled-only encoder computes
  only the [CLS] rows; its dropout masks are the full array's at those rows."""
  axis: int
  positions: jax.Array  # [B, E] int
  length: int


def _expand_rows(positions_BE: jax.Array, ndim: int, axis: int) -> jax.Array:
  """[B, E] row indices -> rank `ndim`, batch on dim 0 and the rows on `axis`."""
  return jnp.expand_dims(positions_BE, tuple(d for d in range(1, ndim) if d != axis))


def hash_bits(key: jax.Array, shape: tuple[int, ...], rows: Rows | None = None) -> jax.Array:
  """Uniform uint32 bits of `shape`: fmix32(fmix32(index ^ k0) + k1) over the
  element's row-major index, keyed by 64 threefry bits of `key`.

  A counter-based generator like threefry, but 2 rounds of multiply/xorshift
  instead of 20 of add/rotate/xor: on XLA:CPU (2 cores) it costs ~0.7 ns per
  element against ~11 ns for `jax.random.bernoulli`. Good enough for dropout
  masks, not for anything that needs cryptographic independence. Elementwise in
  a global iota, so the bits do not depend on how the array is sharded.

  With `rows`, `shape` holds only some rows of a larger array (see `Rows`) and
  the bits are that array's at those rows: the same as slicing the full draw.
  """
  full = list(shape)
  if rows is not None:
    full[rows.axis] = rows.length
  if math.prod(full) >= 2 ** 32:
    raise ValueError(f"hash_bits counts elements in uint32; {tuple(full)} has too many.")
  k = flash.hash_keys(key)
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(range(len(shape))):
    if rows is not None and d == rows.axis:
      i = jnp.broadcast_to(_expand_rows(rows.positions, len(shape), d), shape).astype(jnp.uint32)
    else:
      i = jax.lax.broadcasted_iota(jnp.uint32, shape, d)
    index = index + i * jnp.uint32(stride)
    stride *= full[d]
  return flash.fmix32(flash.fmix32(index ^ k[0]) + k[1])


def dropout(x: jax.Array, rate: float, key: jax.Array, rng: str = "hash",
            rows: Rows | None = None) -> jax.Array:
  """Inverted dropout of x with `key`: `Dropout`'s maths as a function (for code that must
  draw its key outside a transform, e.g. both branches of a lax.cond)."""
  if rate == 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  keep_prob = 1.0 - rate
  if rng == "threefry":
    if rows is None:
      keep = jax.random.bernoulli(key, keep_prob, x.shape)
    else:
      full = x.shape[:rows.axis] + (rows.length,) + x.shape[rows.axis + 1:]
      keep = jnp.take_along_axis(jax.random.bernoulli(key, keep_prob, full),
                                 _expand_rows(rows.positions, x.ndim, rows.axis), rows.axis)
    return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))
  keep = hash_bits(key, x.shape, rows) >= jnp.uint32(min(round(rate * 2 ** 32), 2 ** 32 - 1))
  return jax.lax.select(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros_like(x))


class Dropout(nn.Module):
  """Inverted dropout (drop with probability `rate`, scale the rest by 1/(1-rate)).

  `rng="threefry"` is flax's nn.Dropout (jax.random.bernoulli); `rng="hash"`
  draws the keep mask from `hash_bits` (keep where bits >= rate * 2^32). With
  `rows` (x holds only those rows of a larger array), the mask is the larger
  array's at those rows, so computing fewer rows never changes the result.
  """
  rate: float
  rng: str = "hash"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool, rows: Rows | None = None) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    return dropout(x, self.rate, self.key(), self.rng, rows)

  def key(self) -> jax.Array:
    """The key this module's call draws its mask from (a fused kernel drawing the same)."""
    return self.make_rng("dropout")


def attention_bias(input_mask_BM: jax.Array, dtype) -> jax.Array:
  """[B, M] 1=token 0=padding -> additive bias [B, 1, 1, M]."""
  return jnp.where(input_mask_BM[:, None, None, :] > 0, 0.0, NEG_INF).astype(dtype)


def packed_attention_bias(example_ids_BL: jax.Array, dtype) -> jax.Array:
  """Block-diagonal bias [B, 1, L, M]: a token sees only tokens of its own example."""
  same = example_ids_BL[:, None, :, None] == example_ids_BL[:, None, None, :]
  return jnp.where(same & (example_ids_BL[:, None, None, :] > 0), 0.0, NEG_INF).astype(dtype)


def causal_bias(length: int, dtype) -> jax.Array:
  """[1, 1, L, L]: 0 where a query may attend (its own and earlier positions), -inf after."""
  return jnp.where(jnp.tril(jnp.ones((length, length), bool)), 0.0, NEG_INF).astype(dtype)[None, None]


def take_rows(x: jax.Array, positions_BE: jax.Array | None, axis: int) -> jax.Array:
  """The rows `positions_BE` of x along `axis` (x itself when None)."""
  if positions_BE is None:
    return x
  return jnp.take_along_axis(x, _expand_rows(positions_BE, x.ndim, axis).astype(jnp.int32), axis)


def gather_positions(x_BLD: jax.Array, positions_BP: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_BLD, positions_BP[:, :, None].astype(jnp.int32), axis=1)


def one_hot_lookup(table: nn.Embed, ids: jax.Array) -> jax.Array:
  """`table(ids)` for tables of few rows (positions, token types): a gather forward, and a
  gradient that is a one-hot matmul, not a gather's scatter-add.

  When every token of a batch lands on one of a few rows, a scatter-add's updates collide:
  on an H200 the token-type table's scatter took 138 ms of BERT-base's 134 ms step (L=128,
  batch 256, bf16; bench/RESULTS.md). The gradient is the one-hot matmul's, at full
  precision; ids outside the table give zero rows (as a one-hot of no row would).
  """
  rows = jnp.asarray(table.embedding, table.dtype)
  return _rows_of(rows.shape[0], rows, ids)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rows_of(num_rows: int, rows: jax.Array, ids: jax.Array) -> jax.Array:
  del num_rows  # the gradient's
  return jnp.take(rows, ids, axis=0, mode="fill", fill_value=0)


def _rows_of_fwd(num_rows, rows, ids):
  return _rows_of(num_rows, rows, ids), ids


def _rows_of_bwd(num_rows, ids, g):
  one_hot = jax.nn.one_hot(ids, num_rows, dtype=g.dtype)  # g has the rows' dtype
  batch = tuple(range(ids.ndim))
  return jax.lax.dot_general(one_hot, g, ((batch, batch), ((), ())),
                             precision=jax.lax.Precision.HIGHEST), None


_rows_of.defvjp(_rows_of_fwd, _rows_of_bwd)


def layer_stack(cfg: Any, unrolled: type, scanned: type, *, static_argnums: tuple[int, ...],
                scan_static_argnums: tuple[int, ...], in_axes: tuple[Any, ...],
                all_layers: bool = False) -> type:
  """The layer module an encoder applies: `scanned` under nn.scan over cfg.num_layers
  (parameters stacked on a `layers` axis; `in_axes` as nn.scan's) when cfg.scan_layers,
  else `unrolled` (applied once per layer); either under nn.remat with cfg.remat's policy
  (`static_argnums` / `scan_static_argnums`: its static arguments). `all_layers` (every
  hidden state wanted) needs unrolled layers: a ConfigError under scan_layers."""
  if all_layers and cfg.scan_layers:
    raise errors.ConfigError("Every layer's output (feature-based fine-tuning, "
                             "config.features) needs unrolled layers: set "
                             "--config.model.scan_layers=False.")
  policy = REMAT_POLICIES[cfg.remat]
  whole = cfg.remat not in ("none", "attention")  # the layer under nn.remat
  if not cfg.scan_layers:
    return nn.remat(unrolled, policy=policy, static_argnums=static_argnums) if whole else unrolled
  if whole:
    scanned = nn.remat(scanned, policy=policy, prevent_cse=False, static_argnums=scan_static_argnums)
  return nn.scan(scanned, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                 in_axes=in_axes, length=cfg.num_layers,
                 metadata_params={nn.PARTITION_NAME: "layers"})
