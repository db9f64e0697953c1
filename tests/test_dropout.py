"""model.Dropout: both bit sources keep 1 - rate of the entries, scale them, are keyed and
deterministic; the hash bits are uniform and uncorrelated with the next element."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from bert_jax.models import layers as layers_lib


@pytest.mark.parametrize("rng", ["hash", "threefry"])
def test_dropout_keep_rate_scale_and_keys(rng):
  layer = model_lib.Dropout(0.1, rng=rng)
  x = jnp.ones((64, 128, 96), jnp.float32)
  y = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(0)}))
  kept = y != 0
  assert abs(kept.mean() - 0.9) < 0.003  # 786k draws: 5 sigma ~ 0.0017
  np.testing.assert_allclose(y[kept], 1 / 0.9, rtol=1e-6)
  again = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(0)}))
  other = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(1)}))
  np.testing.assert_array_equal(y, again)
  assert 0.15 < (kept != (other != 0)).mean() < 0.21  # independent masks: 2 * 0.9 * 0.1
  assert (np.asarray(layer.apply({}, x, True)) == 1).all()  # deterministic: identity


def test_hash_bits_uniform_and_uncorrelated():
  bits = np.asarray(layers_lib.hash_bits(jax.random.key(3), (1 << 20,)), np.float64) / 2 ** 32
  hist = np.histogram(bits, bins=16, range=(0, 1))[0] / len(bits)
  assert np.abs(hist - 1 / 16).max() < 0.002
  assert abs(np.corrcoef(bits[:-1], bits[1:])[0, 1]) < 0.005


def test_unknown_dropout_rng_is_refused():
  with pytest.raises(ValueError, match="dropout_rng"):
    model_lib.BertConfig(dropout_rng="mersenne")
