"""bert_jax vs its peers, one invocation: HuggingFace Flax, HuggingFace PyTorch, matmul peak.

    bash bench/setup_flax_peer.sh                 # once: /tmp/flaxpeer_venv (transformers 4.57.6 + jax 0.4.13)
    python -m bench.flax_peer                     # BERT-base, batch 8 x 128, float32
    python -m bench.flax_peer --smoke             # seconds; what the test runs

One after another in this invocation: a JAX float32 matmul peak (the attainable
FLOP/s), bert_jax's train step (bench.train_step.bench_ours), the PyTorch peer
(bench.train_step.bench_torch: transformers.BertForPreTraining + torch AdamW),
and the Flax peer: transformers' `FlaxBertForPreTraining` (random init, same
sizes, tanh GELU, dropout 0.1) with optax AdamW (+ global-norm clip 1.0, no
decay on LayerNorm/bias) in a jitted step computing the same loss (weighted-mean
MLM cross-entropy at the masked positions + mean NSP cross-entropy). The Flax
peer needs the old stack (transformers v5 dropped Flax; 4.57.x pins jax <= 0.4.13),
so it runs in its own venv as a subprocess. MFU uses bert_jax's analytic FLOPs for
every row (the same useful work; HF also projects every position onto the
vocabulary, not only the masked ones, which costs it time but is not counted).
Appends the table to bench/RESULTS.md unless --no_record (or --smoke).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

RESULTS = os.path.join(os.path.dirname(__file__), "RESULTS.md")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
  from bench.train_step import synthetic_batch  # numpy-only helper: the same batch as bert_jax's
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
  print("RESULT " + json.dumps(dict(
      step_s=statistics.median(times), compile_s=compile_s, loss=float(loss),
      versions=f"transformers {transformers.__version__}, jax {jax.__version__}, "
               f"flax {__import__('flax').__version__}, optax {optax.__version__}")), flush=True)


def bench_flax(spec: dict, venv: str, timeout: float) -> dict:
  """The Flax peer in `venv`; {'error': why} when the venv is missing or the run fails."""
  python = os.path.join(venv, "bin", "python")
  if not os.path.exists(python):
    return dict(error=f"no venv at {venv} (run: bash bench/setup_flax_peer.sh {venv})")
  return run_result([python, os.path.abspath(__file__), "--_child", json.dumps(spec)], timeout)


def run_result(cmd: list[str], timeout: float, **env_extra: str) -> dict:
  """Runs a peer's child process on the CPU (its own XLA flags cleared) and returns the JSON
  of its `RESULT ` line, or {'error': the last lines it wrote}."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu",
             **env_extra)
  env.pop("XLA_FLAGS", None)
  try:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
  except subprocess.TimeoutExpired:
    return dict(error=f"timed out after {timeout:.0f} s")
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  tail = [l for l in (proc.stderr or proc.stdout).strip().splitlines() if l.strip()][-3:]
  return dict(error=" | ".join(tail) or f"exit {proc.returncode}")


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="base")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--venv", default=os.environ.get("FLAX_PEER_VENV", DEFAULT_VENV))
  parser.add_argument("--timeout", type=float, default=1200, help="seconds for the Flax peer")
  parser.add_argument("--smoke", action="store_true", help="tiny settings, seconds")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--_child", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._child:
    _flax_child(json.loads(args._child))
    return []
  if args.smoke:
    args.preset, args.seq_len, args.batch, args.steps, args.warmup, args.vocab = "tiny", 32, 2, 2, 1, 500
  from bench import train_step as ts  # main environment only from here on
  dtype = "float32"
  preds = ts.PREDICTIONS.get(args.seq_len, max(1, args.seq_len * 15 // 100))
  tokens = args.batch * args.seq_len
  load0 = os.getloadavg()[0]
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
  table = "\n".join(lines)
  header = (f"{args.preset}, batch {args.batch} x {args.seq_len} (P={preds}), {dtype}; median of "
            f"{args.steps} steps after {args.warmup} warm-up; matmul peak {peak / 1e9:.1f} GFLOP/s; "
            f"analytic {flop / 1e9:.1f} GFLOP/step")
  print(header)
  print(table)
  if not args.no_record and not args.smoke:
    cmd = "python -m bench.flax_peer " + " ".join(argv if argv is not None else sys.argv[1:])
    import jax
    versions = flax_res.get("versions", "not run")
    with open(RESULTS, "a") as f:
      f.write(f"\n## Peers: HuggingFace Flax and PyTorch ({datetime.date.today()})\n\n"
              f"Command: `{cmd}` (after `bash bench/setup_flax_peer.sh`)  \n"
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
              f"(shared; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
              f"end; all four measurements one after another in one invocation, {wall:.0f} s). "
              f"bert_jax: jax {jax.__version__}; Flax peer venv: {versions}.  \n{header}.\n\n"
              f"{table}\n")
  return [dict(impl=n, **r) for n, r in rows]


if __name__ == "__main__":
  if __package__ in (None, ""):  # run as a script by the Flax venv: make `bench` importable
    sys.path.insert(0, REPO)
  main()
