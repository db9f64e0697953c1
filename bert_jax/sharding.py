"""Device mesh, logical-axis shardings and host-to-global batches.

The model names every parameter and activation axis logically (`embed`, `mlp`,
`activation_batch`, ...). A rules table (RULES below, a family's own, or the config's
`logical_axis_rules`) maps those names onto the three mesh axes:

  data    pure data parallelism (parameters replicated)
  fsdp    data parallelism with parameters and optimizer state sharded (ZeRO-3)
  tensor  Megatron-style tensor parallelism inside each layer

so the same code runs from one CPU to a pod by changing `config.mesh_shape`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from common import errors

MESH_AXES = ("data", "fsdp", "tensor")

Rules = Sequence[tuple[str, Any]]


# Logical axis name -> mesh axes (None = replicated): data parallelism over data and fsdp for
# the batch, parameters sharded over fsdp on their embedding axis and over tensor on their
# heads and feed-forward axes (Megatron's layout). Parameters are named vocab, embed, mlp,
# heads, kv, layers; activations activation_*. Every family shards by this table unless its
# Family record names another (`sharding_rules`), and config.logical_axis_rules overrides both.
RULES: tuple[tuple[str, Any], ...] = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("vocab", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)


def resolve_mesh_shape(mesh_shape: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """{data, fsdp, tensor} with at most one -1 ("the rest") -> concrete sizes."""
  unknown = set(mesh_shape) - set(MESH_AXES)
  if unknown:
    raise errors.ConfigError(f"config.mesh_shape has unknown axes {sorted(unknown)}; use "
                             f"{MESH_AXES}.")
  sizes = [int(mesh_shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise errors.ConfigError(f"At most one mesh axis may be -1, got {dict(mesh_shape)}.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise errors.ConfigError(f"config.mesh_shape {dict(mesh_shape)} does not divide the "
                               f"{num_devices} devices: set --config.mesh_shape.* so that "
                               "their product (with -1 = the rest) is the device count.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise errors.ConfigError(f"config.mesh_shape {dict(zip(MESH_AXES, sizes))} needs "
                             f"{math.prod(sizes)} devices but {num_devices} are available: set "
                             "--config.mesh_shape.* so that their product is the device count "
                             "(-1 = the rest).")
  return tuple(sizes)


def make_mesh(mesh_shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over ("data", "fsdp", "tensor") with Auto axis types (GSPMD propagation)."""
  devices = jax.devices() if devices is None else list(devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def _fit_spec(spec: P, shape: Sequence[int], mesh: Mesh, what: str) -> P:
  """Drops mesh axes from dimensions they do not divide (e.g. 2 heads on tensor=8).

  Such a dimension is replicated instead, with a log line, so that any mesh
  runs any model; an efficient layout needs divisible sizes.
  """
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    keep = []
    for name in names:
      size = math.prod(mesh.shape[a] for a in keep + [name])
      if dim % size == 0:
        keep.append(name)
      else:
        logging.log_first_n(logging.INFO, "Replicating %s dim of size %d over mesh axis %r "
                            "(not divisible by %d).", 20, what, dim, name, mesh.shape[name])
    fitted.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
  return P(*fitted)


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """Shardings for a tree of (boxed) abstract values, from their logical axis names.

  `abstract_tree` comes from `jax.eval_shape` of an init function whose params
  (and optimizer state, which inherits the boxes through `tx.init`) are
  `nn.Partitioned`. Returns a tree shaped like `nn.unbox(abstract_tree)`.
  """
  logical = nn.get_partition_spec(abstract_tree)
  mesh_specs = nn.logical_to_mesh(logical, rules)
  unboxed = strip_boxes(abstract_tree)
  paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(unboxed)
  specs = treedef.flatten_up_to(mesh_specs)
  shardings = [
      NamedSharding(mesh, _fit_spec(spec or P(), leaf.shape, mesh, jax.tree_util.keystr(path)))
      for (path, leaf), spec in zip(paths_and_leaves, specs)]
  return jax.tree_util.tree_unflatten(treedef, shardings)


def strip_boxes(tree: Any) -> Any:
  """nn.unbox without the sharding constraint (safe outside jit under a mesh)."""
  is_box = lambda x: isinstance(x, nn.Partitioned)
  return jax.tree.map(lambda x: x.value if is_box(x) else x, tree, is_leaf=is_box)


def batch_axes(rules: Rules) -> tuple[str, ...]:
  """Mesh axes the batch dimension is split over (the `activation_batch` rule)."""
  for name, axes in rules:
    if name == "activation_batch":
      return (axes,) if isinstance(axes, str) else tuple(axes or ())
  return ()


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """[B, ...] arrays split over the batch axes, replicated elsewhere."""
  return NamedSharding(mesh, P(batch_axes(rules) or None))


def num_batch_shards(mesh: Mesh, rules: Rules) -> int:
  return math.prod(mesh.shape[a] for a in batch_axes(rules))


def check_batch_size(global_batch: int, micro_steps: int, mesh: Mesh, rules: Rules,
                     name: str = "global_batch_size") -> None:
  """A clear error (naming the config field) unless `global_batch` rows split evenly into
  `micro_steps` micro-batches over the mesh's batch shards and the processes."""
  shards = num_batch_shards(mesh, rules)
  procs = jax.process_count()
  unit = math.lcm(micro_steps * shards, procs)
  if shards % procs:
    raise errors.ConfigError(
        f"The batch axes of mesh {dict(mesh.shape)} ({shards} shards) must span the {procs} "
        f"processes: set --config.mesh_shape so that they do.")
  if global_batch < 1 or global_batch % unit:
    raise errors.ConfigError(
        f"--config.{name}={global_batch}: it must be a positive multiple of {unit} ("
        + (f"{micro_steps} micro-batches (grad_accum_steps) x " if micro_steps > 1 else "")
        + f"{shards} batch shards of mesh {dict(mesh.shape)}"
        + (f", over {procs} processes" if procs > 1 else "") + f"), e.g. {max(unit, global_batch // unit * unit)}.")


def host_to_global(batch: Mapping[str, np.ndarray], sharding: NamedSharding
                   ) -> dict[str, jax.Array]:
  """Each host's slice of the global batch -> global jax.Arrays.

  Host i holds rows i*b:(i+1)*b of the global batch (b rows per host).
  """
  def one(x):
    x = np.asarray(x)
    global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(sharding, x, global_shape)
  return {k: one(v) for k, v in batch.items()}


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
