"""bert_jax vs its peers, one invocation: HuggingFace Flax, HuggingFace PyTorch, matmul peak.

    bash bench/setup_flax_peer.sh                 # once: /tmp/flaxpeer_venv (transformers 4.57.6 + jax 0.4.13)
    python -m bench.peers.flax_peer                     # BERT-base, batch 8 x 128, float32
    python -m bench.peers.flax_peer --smoke             # seconds; what the test runs

One after another in this invocation: a JAX float32 matmul peak (the attainable
FLOP/s), bert_jax's train step (bench.peers.train_step.bench_ours), the PyTorch peer
(bench.peers.train_step.bench_torch: transformers.BertForPreTraining + torch AdamW),
and the Flax peer: transformers' `FlaxBertForPreTraining` (random init, same
sizes, tanh GELU, dropout 0.1) with optax AdamW (+ global-norm clip 1.0, no
decay on LayerNorm/bias) in a jitted step computing the same loss (weighted-mean
MLM cross-entropy at the masked positions + mean NSP cross-entropy). The Flax
peer needs the old stack (transformers v5 dropped Flax; 4.57.x pins jax <= 0.4.13),
so it runs in its own venv as a subprocess. MFU uses bert_jax's analytic FLOPs for
every row (the same useful work; HF also projects every position onto the
vocabulary, not only the masked ones, which costs it time but is not counted).
Appends the table to bench/results/peers.md unless --no_record (or --smoke).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script by the Flax venv: make `bench` importable
  sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from bench import harness  # pylint: disable=g-import-not-at-top  # stdlib only

REPO = harness.REPO
DEFAULT_VENV = "/tmp/flaxpeer_venv"
SIZES = {  # (layers, hidden, heads), as bert_jax.models.bert.PRESETS (the venv cannot import it)
    "tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8),
    "medium": (8, 512, 8), "base": (12, 768, 12), "large": (24, 1024, 16)}


def _flax_child(spec: dict) -> None:
  """Runs inside the old-stack venv: only jax/flax/optax/transformers/numpy."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import transformers
  from bench.peers.train_step import synthetic_batch  # numpy-only helper: the same batch as bert_jax's
  layers, hidden, heads = SIZES[spec["preset"]]
  B, L, P, V = spec["batch"], spec["L"], spec["preds"], spec["vocab"]
  cfg = transformers.BertConfig(vocab_size=V, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=4 * hidden,
                                hidden_act="gelu_new", max_position_embeddings=512)
  model = transformers.FlaxBertForPreTraining(cfg, seed=0, dtype=jnp.float32)
  params = model.params
  mask = jax.tree_util.tree_map_with_path(
      lambda path, _: not any(s in jax.tree_util.keystr(path) for s in ("LayerNorm", "bias")),
      params)
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask))
  opt_state = tx.init(params)
  batch = {k: jnp.asarray(v)
           for k, v in synthetic_batch(np.random.default_rng(0), B, L, P, V).items()}

  def loss_fn(p, b, rng):
    out = model(b["input_ids"], attention_mask=b["input_mask"], token_type_ids=b["segment_ids"],
                params=p, dropout_rng=rng, train=True)
    logits_BPV = jnp.take_along_axis(out.prediction_logits, b["masked_lm_positions"][..., None], 1)
    nll_BP = -jnp.take_along_axis(jax.nn.log_softmax(logits_BPV), b["masked_lm_ids"][..., None],
                                  -1)[..., 0]
    w = b["masked_lm_weights"]
    mlm = jnp.sum(nll_BP * w) / jnp.maximum(jnp.sum(w), 1e-8)
    nsp = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(out.seq_relationship_logits),
                                        b["next_sentence_labels"][:, None], -1))
    return mlm + nsp

  @jax.jit
  def step(p, o, b, rng):
    loss, grads = jax.value_and_grad(loss_fn)(p, b, rng)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss

  rng = jax.random.PRNGKey(0)
  t = time.perf_counter()
  compiled = step.lower(params, opt_state, batch, rng).compile()
  compile_s = time.perf_counter() - t
  times = []
  for i in range(spec["warmup"] + spec["steps"]):
    t = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, batch, jax.random.fold_in(rng, i))
    loss.block_until_ready()
    if i >= spec["warmup"]:
      times.append(time.perf_counter() - t)
  harness.emit(dict(
      step_s=statistics.median(times), compile_s=compile_s, loss=float(loss),
      versions=f"transformers {transformers.__version__}, jax {jax.__version__}, "
               f"flax {__import__('flax').__version__}, optax {optax.__version__}"))


def bench_flax(spec: dict, venv: str, timeout: float) -> dict:
  """The Flax peer in `venv`; {'error': why} when the venv is missing or the run fails."""
  python = os.path.join(venv, "bin", "python")
  if not os.path.exists(python):
    return dict(error=f"no venv at {venv} (run: bash bench/setup_flax_peer.sh {venv})")
  return run_result([python, os.path.abspath(__file__), "--_child", json.dumps(spec)], timeout)


def run_result(cmd: list[str], timeout: float, **env_extra: str) -> dict:
  """Runs a peer's child process on the CPU (its own XLA flags cleared) and returns the JSON
  of its `RESULT ` line, or {'error': the last lines it wrote}."""
  env = harness.child_env(REPO, drop=("XLA_FLAGS",), JAX_PLATFORMS="cpu", **env_extra)
  return harness.child_row(cmd, env=env, timeout=timeout)


def _parser():
  parser = harness.parser(__doc__, child=True)
  parser.add_argument("--preset", default="base")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--venv", default=os.environ.get("FLAX_PEER_VENV", DEFAULT_VENV))
  parser.add_argument("--timeout", type=float, default=1200, help="seconds for the Flax peer")
  return parser


def _measure(args, preds: int) -> tuple[list, float, float]:
  """The three peers one after another: [(name, result)], the matmul peak, the wall seconds."""
  from bench.peers import train_step as ts  # main environment only from here on
  dtype = "float32"
  t = time.perf_counter()
  width = SIZES[args.preset][1]
  peak = ts.robust_peak(width, args.batch * args.seq_len)
  print(f"matmul peak (float32): {peak / 1e9:.1f} GFLOP/s", flush=True)
  ours = ts.bench_ours(args.preset, args.seq_len, dtype, args.batch, args.steps, args.warmup, args.vocab)
  print(f"bert_jax: {1e3 * ours['step_s']:.0f} ms/step", flush=True)
  torch_res = ts.bench_torch(args.preset, args.seq_len, dtype, args.batch, args.steps, args.warmup,
                             args.vocab)
  print(f"transformers-torch: {1e3 * torch_res['step_s']:.0f} ms/step", flush=True)
  flax_res = bench_flax(dict(preset=args.preset, L=args.seq_len, batch=args.batch, preds=preds,
                             vocab=args.vocab, steps=args.steps, warmup=args.warmup),
                        args.venv, args.timeout)
  print(f"transformers-flax: {flax_res}", flush=True)
  wall = time.perf_counter() - t
  flop = ours["analytic_flops"]
  # Measured again after the runs, and raised to any rate a run achieved: MFU <= 100%.
  peak = max([peak, ts.robust_peak(width, args.batch * args.seq_len)]
             + [flop / r["step_s"] for r in (ours, torch_res, flax_res) if "step_s" in r])
  rows = [("bert_jax", ours), ("transformers-torch (PyTorch)", torch_res),
          ("transformers-flax (FlaxBertForPreTraining)", flax_res)]
  return rows, peak, wall


def _table(rows, args, peak: float) -> str:
  tokens = args.batch * args.seq_len
  ours = rows[0][1]
  flop = ours["analytic_flops"]
  lines = [f"| impl | tokens/s | step ms | compile s | MFU | bert_jax / impl | loss after {args.warmup + args.steps} steps |",
           "|" + "---|" * 7]
  for name, r in rows:
    if "error" in r:
      lines.append(f"| {name} | unavailable: {r['error']} | | | | | |")
      continue
    compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else "n/a"
    lines.append(f"| {name} | {tokens / r['step_s']:.1f} | {1e3 * r['step_s']:.0f} | {compile_s} | "
                 f"{100 * flop / r['step_s'] / peak:.1f}% | {r['step_s'] / ours['step_s']:.2f} | "
                 f"{r['loss']:.3f} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  args = _parser().parse_args(argv)
  if (spec := harness.child_spec(args)) is not None:
    _flax_child(spec)
    return []
  if args.smoke:
    args.preset, args.seq_len, args.batch, args.steps, args.warmup, args.vocab = "tiny", 32, 2, 2, 1, 500
  from bench.peers import train_step as ts  # main environment only from here on
  preds = ts.PREDICTIONS.get(args.seq_len, max(1, args.seq_len * 15 // 100))
  load0 = os.getloadavg()[0]
  rows, peak, wall = _measure(args, preds)
  table = _table(rows, args, peak)
  header = (f"{args.preset}, batch {args.batch} x {args.seq_len} (P={preds}), float32; median of "
            f"{args.steps} steps after {args.warmup} warm-up; matmul peak {peak / 1e9:.1f} GFLOP/s; "
            f"analytic {rows[0][1]['analytic_flops'] / 1e9:.1f} GFLOP/step")
  print(header)
  print(table)
  if harness.recording(args):
    import jax
    versions = rows[2][1].get("versions", "not run")
    harness.record(
        __name__, "Peers: HuggingFace Flax and PyTorch", table,
        command=harness.command("bench.peers.flax_peer", argv) + " (after `bash bench/setup_flax_peer.sh`)",
        machine=f"{harness.machine()} (shared; {harness.load_span(load0)}; all four "
                f"measurements one after another in one invocation, {wall:.0f} s). bert_jax: jax "
                f"{jax.__version__}; Flax peer venv: {versions}.  \n{header}.")
  return [dict(impl=n, **r) for n, r in rows]


if __name__ == "__main__":
  main()
