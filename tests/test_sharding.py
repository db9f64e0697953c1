"""Mesh construction, logical-axis shardings, and data / FSDP / tensor parallelism giving
the same training as one device (8 fake CPU devices, in a subprocess)."""
import json

import pytest
from jax.sharding import PartitionSpec as P

from bert_jax import sharding
from tests import test_train_utils as tu


def test_resolve_mesh_shape():
  assert sharding.resolve_mesh_shape({"data": -1}, 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == (2, 2, 2)
  assert sharding.resolve_mesh_shape({"data": 1, "fsdp": 1, "tensor": 8}, 8) == (1, 1, 8)
  with pytest.raises(ValueError, match="needs 4 devices"):
    sharding.resolve_mesh_shape({"data": 2, "fsdp": 2}, 8)
  with pytest.raises(ValueError, match="At most one"):
    sharding.resolve_mesh_shape({"data": -1, "fsdp": -1}, 8)
  with pytest.raises(ValueError, match="does not divide"):
    sharding.resolve_mesh_shape({"data": -1, "fsdp": 3}, 8)
  with pytest.raises(ValueError, match="unknown axes"):
    sharding.resolve_mesh_shape({"model": 2}, 8)


def test_batch_axes_from_rules():
  assert tu.tiny_config().logical_axis_rules is None  # the family's: sharding.RULES
  assert sharding.batch_axes(sharding.RULES) == ("data", "fsdp")


def test_the_config_rules_replace_the_familys(monkeypatch):
  """Unset, config.logical_axis_rules is the model family's table (one of its own here: the
  mesh shards by it); set (a config file's tuple, or a --config flag through ConfigDict, which
  makes lists of it), it replaces that table."""
  import dataclasses
  from bert_jax import registry
  from bert_jax import trainer
  from bert_jax.models import bert_formats
  config = tu.tiny_config()
  model, objective, sample = registry.pretraining(config, vocab_size=64)
  assert trainer.logical_rules(config, model) == sharding.RULES
  own = tuple((name, None if name == "activation_batch" else axes)
              for name, axes in sharding.RULES)  # the batch replicated
  monkeypatch.setitem(bert_formats.FAMILIES, "bert", dataclasses.replace(
      bert_formats.FAMILIES["bert"], sharding_rules=own))
  assert trainer.logical_rules(config, model) == own
  built = trainer.build(config, model, objective, sample, workdir=None)
  assert built.rules == own and sharding.batch_axes(built.rules) == ()
  config.logical_axis_rules = (("activation_batch", ("data",)), ("embed", None))
  assert trainer.logical_rules(config, model) == (("activation_batch", ("data",)),
                                                 ("embed", None))
  config.logical_axis_rules = [["activation_batch", ["data", "fsdp"]], ["mlp", "tensor"]]
  assert trainer.logical_rules(config, model) == (("activation_batch", ("data", "fsdp")),
                                                 ("mlp", "tensor"))


_EQUIVALENCE = r"""
import json
import jax, numpy as np
from bert_jax import sharding
from input_pipeline import synthetic
from tests import test_train_utils as tu

# Dropout on: random bits are sharding-invariant. One layer keeps compilation short.
config = tu.tiny_config(global_batch_size=16, model__num_layers=1)
it = synthetic.SyntheticIterator(batch_size=16, seq_len=32, num_predictions=5, vocab_size=128)
batches = [next(it) for _ in range(2)]

def run(shape, n_devices, micro_steps=1):
  c = config.copy_and_resolve_references()
  c.mesh_shape.update(dict(zip(sharding.MESH_AXES, shape)))
  c.grad_accum_steps = micro_steps
  trainer = tu.pretraining_trainer(c, devices=jax.devices()[:n_devices])
  with trainer.activate():
    state = trainer.init()
    losses = []
    for b in batches:
      state, m = trainer.train_step(state, trainer.to_global(b), jax.random.key(1))
      losses.append(float(m["loss"]))
    kernel = state.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    spec = str(kernel.sharding.spec)
    shard_shape = kernel.addressable_shards[0].data.shape
    return losses, jax.device_get(state.params), spec, shard_shape

ref_losses, ref_params, _, _ = run((1, 1, 1), 1)
out = {}
for shape, micro in [((2, 4, 1), 2), ((2, 2, 2), 1), ((1, 1, 8), 1)]:
  losses, params, spec, shard_shape = run(shape, 8, micro)
  diff = max(float(np.max(np.abs(a - b))) for a, b in
             zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)))
  out[f"{shape}x{micro}"] = dict(losses=losses, diff=diff, spec=spec, shard=list(shard_shape))
print("RESULT" + json.dumps(dict(ref=ref_losses, runs=out)))
"""


def test_data_fsdp_tensor_parallel_match_one_device():
  out = tu.run_python(_EQUIVALENCE, devices=8, timeout=400)
  result = json.loads(out.split("RESULT", 1)[1])
  ref = result["ref"]
  runs = result["runs"]
  for name, r in runs.items():
    for a, b in zip(r["losses"], ref):
      assert abs(a - b) <= 2e-5 * abs(b), (name, r["losses"], ref)
    assert r["diff"] < 2e-5, (name, r["diff"])
  # The parameters really are sharded: intermediate kernel [embed=64, mlp=256].
  assert runs["(2, 4, 1)x2"]["spec"] == "P('fsdp', 'tensor')"
  assert runs["(2, 4, 1)x2"]["shard"] == [16, 256]
  assert runs["(2, 2, 2)x1"]["shard"] == [32, 128]
  assert runs["(1, 1, 8)x1"]["shard"] == [64, 32]


def test_indivisible_dimensions_are_replicated():
  class FakeMesh:  # only .shape is consulted
    shape = {"data": 1, "fsdp": 2, "tensor": 8}
  # 2 heads cannot split 8 ways: replicated on that dim, still sharded on the other.
  assert sharding._fit_spec(P("fsdp", "tensor"), (64, 2), FakeMesh, "x") == P("fsdp", None)
  assert sharding._fit_spec(P(("fsdp", "tensor"),), (6,), FakeMesh, "x") == P("fsdp")
  FakeMesh.shape = {"data": 4, "fsdp": 2, "tensor": 1}
  assert sharding._fit_spec(P(("data", "fsdp"),), (6,), FakeMesh, "x") == P("fsdp")
  assert sharding._fit_spec(P(("data", "fsdp"),), (8,), FakeMesh, "x") == P(("data", "fsdp"))
