"""Attention FLOPs executed at L=8192 with ModernBERT's layer pattern, as XLA compiles them.

    python -m bench.accel.attention_flops [--preset=modernbert-base --seq_len=8192 --budget=0.25]

Lowers and compiles (nothing runs; compile-only on this CPU) one sequence's attention of
each layer kind, forward only, and reads XLA's own FLOP count (`cost_analysis`):
  - dense: every L x L score (the reference, and transformers' eager/sdpa cost);
  - local: modern.banded_attention (3 blocks of window // 2 keys per query block);
  - global over packed rows: modern.packed_global_attention within its static budget of
    block pairs (the dense fallback branch is not counted: it runs only when a batch needs
    more pairs than the budget; the script reports how often a realistic length mix does);
  - bert_jax.flash (model.attention=flash): the share of block pairs its kernels visit on
    packed rows of that length mix (they skip the pairs no query reads).
The model total weights each kind by the preset's layer pattern (global every 3rd layer)
and compares with every layer dense. The length mix: document lengths log-normal (median
300 tokens, sigma 1.0, capped at L), packed greedily into rows of L in arrival order.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import modern
from bert_jax.models import modern_attention

from bench import harness



def _flops(fn, *shapes) -> float:
  args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


def length_mix(rng, L: int, rows: int) -> np.ndarray:
  """[rows, L] packed example ids of log-normal document lengths (median 300, capped)."""
  seg = np.zeros((rows, L), np.int32)
  for r in range(rows):
    pos, e = 0, 0
    while pos < L:
      n = int(min(L, max(8, rng.lognormal(np.log(300), 1.0))))
      n = min(n, L - pos)
      e += 1
      seg[r, pos:pos + n] = e
      pos += n
  return seg


def need_fraction(seg: np.ndarray, block: int) -> float:
  """Share of block pairs a row's examples need (the budget a batch must fit)."""
  n = seg.shape[1] // block
  b = seg.reshape(seg.shape[0], n, block)
  lo = np.where(b > 0, b, 2**31 - 1).min(-1)
  hi = np.where(b > 0, b, 0).max(-1)
  need = np.maximum(lo[:, :, None], lo[:, None, :]) <= np.minimum(hi[:, :, None], hi[:, None, :])
  return float(need.mean())


def flash_visits(seg: np.ndarray, half_window: int | None, block: int = 64) -> tuple[float, float]:
  """Shares of the (query block, key block) pairs that bert_jax.flash's kernels visit on these
  packed rows (padding, example id 0, reads nothing): the forward and dq kernels', and the
  dk/dv kernel's (the rest are skipped; looping over every pair is 1.0)."""
  from bert_jax import flash  # pylint: disable=g-import-not-at-top
  rows, L = seg.shape
  q_ranges, k_ranges = flash._block_ranges(  # pylint: disable=protected-access
      jnp.asarray(np.where(seg > 0, seg, -1)), jnp.asarray(seg),
      jnp.broadcast_to(jnp.arange(L), (rows, L)), block, block, causal=False, window=half_window)
  visits = lambda r: float(np.sum(np.asarray(r[..., 1] - r[..., 0])))
  full = rows * (L // block) ** 2
  return visits(q_ranges) / full, visits(k_ranges) / full


def _layer_flops(cfg, L: int, budget: float) -> tuple[float, float, float]:
  """XLA's FLOPs per sequence of one dense, one banded (local) and one budgeted global layer."""
  H, G, K = cfg.num_heads, cfg.kv_heads, cfg.head_dim
  q, kv, seg = ((1, L, H, K), jnp.float32), ((1, L, G, K), jnp.float32), ((1, L), jnp.int32)
  dense = _flops(lambda a, b, c, s: modern.dense_attention(a, b, c, s, None, jnp.float32),
                 q, kv, kv, seg)
  local = _flops(lambda a, b, c, s: modern.banded_attention(a, b, c, s, cfg.local_window // 2,
                                                            jnp.float32), q, kv, kv, seg)
  # The sparse branch alone (the cond's other branch, dense, runs only past the budget).
  n = -(-L // cfg.global_block)
  pairs = int(np.ceil(budget * n * n))
  sparse = _flops(lambda a, b, c, s: modern_attention.block_pair_attention(
      a, b, c, s, modern_attention.block_pairs_needed(s, cfg.global_block), pairs, cfg.global_block,
      jnp.float32), q, kv, kv, seg)
  return dense, local, sparse


def _visits(cfg, L: int, args) -> tuple[list[float], float, tuple, tuple]:
  """The block pairs a length mix needs, the share of batches within the budget, and the
  pairs bert_jax.flash visits on that mix and on bench/accel/gpu_step.py's modern-packed batch."""
  rng = np.random.default_rng(0)
  fractions = [need_fraction(length_mix(rng, L, args.batch), cfg.global_block) for _ in range(50)]
  fits = float(np.mean([f <= args.budget for f in fractions]))
  mix = length_mix(np.random.default_rng(1), L, args.batch)
  on_mix = flash_visits(mix, None), flash_visits(mix, cfg.local_window // 2)
  from bench.accel import gpu_step  # pylint: disable=g-import-not-at-top
  _, batches, _, _ = gpu_step.bert_jax_workload(gpu_step.workload_spec(
      "modern-packed", "bfloat16", False, {}))
  rows = np.asarray(batches[0]["packed_example_ids"])
  on_rows = rows, flash_visits(rows, None), flash_visits(rows, cfg.local_window // 2)
  return fractions, fits, on_mix, on_rows


def main(argv=None):
  p = harness.parser(__doc__, smoke=False)
  p.add_argument("--preset", default="modernbert-base")
  p.add_argument("--seq_len", type=int, default=8192)
  p.add_argument("--budget", type=float, default=0.25)
  p.add_argument("--batch", type=int, default=8, help="rows per batch for the fit check")
  args = p.parse_args(argv)
  cfg = modern.ModernConfig.from_preset(args.preset, global_block_budget=args.budget)
  L, H, K = args.seq_len, cfg.num_heads, cfg.head_dim
  dense, local, sparse = _layer_flops(cfg, L, args.budget)
  n_global = sum(cfg.is_global(i) for i in range(cfg.num_layers))
  n_local = cfg.num_layers - n_global
  ours = n_global * sparse + n_local * local
  ours_dense_global = n_global * dense + n_local * local
  everything = cfg.num_layers * dense
  fractions, fits, (flash_global, flash_local), (rows, row_global, row_local) = _visits(cfg, L, args)
  analytic = modern_attention.attention_flops(cfg, L, executed=True) / modern_attention.attention_flops(
      cfg.replace(global_every=1, global_block_budget=0.0), L)
  lines = [
      f"{args.preset}, L={L}, {cfg.num_layers} layers ({n_global} global, {n_local} local, "
      f"window {cfg.local_window}), heads {H}x{K}; XLA cost_analysis FLOPs per sequence:",
      f"  dense layer {dense:.3e}; local (banded) {local:.3e} = {local / dense:.4f} of dense; "
      f"global over packed rows (budget {args.budget}) {sparse:.3e} = {sparse / dense:.4f}",
      f"  model: all dense {everything:.3e}; banded local + dense global "
      f"{ours_dense_global / everything:.4f}; banded local + budgeted global "
      f"{ours / everything:.4f} (analytic {analytic:.4f})",
      f"  length mix (log-normal, median 300): block pairs needed per batch of {args.batch} "
      f"rows: median {np.median(fractions):.3f}, max {max(fractions):.3f}; batches within the "
      f"budget: {100 * fits:.0f}%",
      f"  bert_jax.flash (model.attention=flash, blocks of 64) on one batch of that mix: block "
      f"pairs visited, forward and dq / dk and dv: global {flash_global[0]:.3f} / "
      f"{flash_global[1]:.3f}, local {flash_local[0]:.3f} / {flash_local[1]:.3f}",
      f"  the same on bench/accel/gpu_step.py's modern-packed batch ({rows.shape[0]} rows of "
      f"{rows.shape[1]}, {100 * (rows == 0).mean():.1f}% padding): global {row_global[0]:.3f} / "
      f"{row_global[1]:.3f}, local {row_local[0]:.3f} / {row_local[1]:.3f}",
  ]
  print("\n".join(lines))
  if not args.no_record:
    harness.record(
        __name__, f"Attention FLOPs executed at L={L}, ModernBERT layer pattern",
        "```\n" + "\n".join(lines) + "\n```",
        command=(f"python -m bench.accel.attention_flops --preset={args.preset} --seq_len={L} "
                 f"--budget={args.budget}"),
        machine=f"{harness.machine()}; jax {jax.__version__} (compile only).")
  return ours / everything


if __name__ == "__main__":
  main()
