"""FP8 matmuls (`model.matmul_dtype="fp8"`): a `dot_general` whose operands pass through FP8.

The forward operands in E4M3 and the output's gradient in E5M2 (the two formats Hopper's
tensor cores multiply), each tensor at its own power-of-two scale taken from its current
absolute maximum (per-tensor current scaling: no state, so the parameters, checkpoints and
exports are exactly the bf16 model's). Each operand is quantised and dequantised in the compute
dtype right before the matmul (`qdq`): the pattern XLA's GPU GEMM rewriter turns into an FP8
cuBLASLt matmul with the scales folded in (not yet read in a GPU's optimized HLO); other
backends compute the same values in the compute dtype (how the tests prove, on CPU, that the
model trains). The gradients pass
straight through the quantisation, as in Transformer Engine and Flax's Fp8DotGeneralOp; a
power-of-two scale makes dequantisation exact.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

MATMUL_DTYPES = (None, "fp8")
FORWARD = jnp.float8_e4m3fn  # activations and weights: 3 mantissa bits, max 448
BACKWARD = jnp.float8_e5m2  # gradients: 2 mantissa bits, max 57344


def qdq(x: jax.Array, dtype: Any) -> jax.Array:
  """The values `x` keeps in the FP8 `dtype` (saturating at its largest value), scaled by the
  power of two that brings max|x| within its range, back in x's dtype."""
  fmax = float(jnp.finfo(dtype).max)
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  _, exponent = jnp.frexp(jnp.where(amax > 0, amax / fmax, 1.0))  # amax / fmax < 2**exponent
  # An infinite (or NaN) entry makes the whole tensor NaN, as the matmul would have, instead
  # of saturating to a finite value that the trainer's non-finite checks would miss.
  scale = jnp.where(jnp.isfinite(amax), jnp.ldexp(jnp.float32(1), exponent), jnp.nan)
  scale = jax.lax.stop_gradient(scale)
  q = jnp.clip(x.astype(jnp.float32) / scale, -fmax, fmax).astype(dtype)
  return q.astype(x.dtype) * scale.astype(x.dtype)


@jax.custom_vjp
def _operand(x):
  return qdq(x, FORWARD)


_operand.defvjp(lambda x: (qdq(x, FORWARD), None), lambda _, g: (g,))


@jax.custom_vjp
def _output(y):
  return y


_output.defvjp(lambda y: (y, None), lambda _, g: (qdq(g, BACKWARD),))


def fp8_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                    **kwargs):
  """jax.lax.dot_general of lhs and rhs as E4M3 holds them; its output's gradient as E5M2
  holds it (so both backward matmuls multiply FP8 values too)."""
  out = jax.lax.dot_general(_operand(lhs), _operand(rhs), dimension_numbers,
                            precision=precision, preferred_element_type=preferred_element_type,
                            **kwargs)
  return _output(out)


def dot_general(matmul_dtype: str | None) -> Callable[..., jax.Array]:
  """The dot_general of a model config's `matmul_dtype` (None: the compute dtype's)."""
  return fp8_dot_general if matmul_dtype == "fp8" else jax.lax.dot_general
