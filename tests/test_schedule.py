"""The learning-rate schedule is the same function of the step whether its numbers are
constants or inputs of the compiled step (optim.learning_rate_schedule vs optax's)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import optim
from tests import test_train_utils as tu


def _optax(lr, warmup, decay, end=0.0):
  """The schedule as bert_jax built it from optax before the step took it as inputs."""
  return optax.join_schedules([optax.linear_schedule(0.0, lr, max(warmup, 1)),
                               optax.linear_schedule(lr, end, max(decay - warmup, 1))], [warmup])


@pytest.mark.parametrize("lr,warmup,decay", list(itertools.product(
    [1e-4, 5e-5, 3e-5, 2e-5, 5e-3], [0, 1, 80, 10_000], [1, 801, 1_000_000])))
def test_traced_schedule_is_bitwise_optax_linear_warmup_decay(lr, warmup, decay):
  steps = np.unique(np.concatenate([np.arange(0, 900), np.arange(max(decay - 900, 0), decay + 3),
                                    [warmup - 1, warmup, warmup + 1]])).astype(np.int32)
  steps = jnp.asarray(steps[steps >= 0])
  hp = dict(lr=np.float32(lr), warmup_steps=np.int32(warmup), decay_steps=np.int32(decay),
            end_lr=np.float32(0.0))
  # As in the train step: one scalar step count, compiled as the job compiles it (XLA turns
  # optax's division by a constant into a multiplication by its reciprocal; the traced
  # schedule does the same; not so at the tests' fast-compile optimisation level).
  constant = jax.jit(lambda s: _optax(lr, warmup, decay)(s))
  traced = jax.jit(lambda s, h: optim.learning_rate_schedule(**h)(s))
  both = jax.jit(lambda s, h: (jax.lax.map(constant, s), jax.lax.map(lambda x: traced(x, h), s)))
  want, got = both.lower(steps, hp).compile(compiler_options=tu.JOB_COMPILER_OPTIONS)(steps, hp)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

