"""ModernBERT pre-training step: bert_jax (packed rows) vs transformers (PyTorch), useful tokens/s.

    python -m bench.peers.modern_step                   # ModernBERT-base shape, L=1024, fp32, 1 row a step
    python -m bench.peers.modern_step --layers=11       # half the depth (same 4/11 = 8/22 global share)
    python -m bench.peers.modern_step --smoke           # tiny model, seconds (what the test runs)

Memory: at 22 layers and one 1024-token row the bert_jax process peaks near 8 GB and the
PyTorch one near 4 GB (XLA's temp buffers grow with rows x layers); on a shared 24 GB host
that is why the default is one row. Both processes ask to be the OOM killer's first choice.

The workload: documents whose lengths are log-normal (median --median_len tokens, sigma
--sigma of the log, at least --min_len, truncated at L), each one example `[CLS] body [SEP]`
of random ids, 30% of its body masked as input_pipeline/masking.py does (n = floor(0.3 m + u),
80/10/10 [MASK]/random/kept). The examples are packed into rows of L by
input_pipeline/packing.py (greedy, 16 open rows, at most 8 examples and P + E = 328
predictions a row, as configs/modern_pretrain.py); a step is --rows consecutive rows, and
both sides train on exactly the examples of those rows (the same useful tokens a step).

  bert_jax      configs/modern_pretrain.py:modernbert-base (float32; --layers may cut the
                depth), registry.pretraining + trainer.build: the trainer's jitted train_step
                (forward, backward, StableAdamW with global-norm clipping) on the packed rows
                (attention within each example; local layers banded).
  transformers  ModernBertForMaskedLM of the same config (modern_formats.config_to_hf, with
                sparse_prediction: the head and decoder only at masked tokens, as ours),
                SDPA attention, torch.optim.AdamW (fused when available) after global-norm
                clipping, torch.set_num_threads = our core count. Several correct ways to
                feed it the step's examples are timed first (--torch_modes) and the fastest
                is raced:
                  packed_mask  the same packed rows with position_ids restarting per example
                               and a dict of 4D boolean masks (block-diagonal; AND the +-64
                               band for the sliding layers): transformers' bidirectional
                               masks do not split packed rows from position_ids by
                               themselves, so attention_mask=None would leak across examples
                  padded       all the step's examples in one batch padded to the longest
                               (not a default candidate: several times the tokens and memory)
                  bucketed     examples sorted by length into micro-batches of <= L padded
                               tokens (gradients accumulated into one optimizer step)
                  bucketed_step  the same with micro-batches of <= rows x L padded tokens (the
                               step's budget: what fills a GPU; bench/accel/gpu_step.py's default)
                  per_example  each example alone (no padding, attention_mask None)
                Losses of all modes on the same weights are checked to agree first.
                (flex_attention would skip masked blocks but has no CPU backward.)

Each side runs in its own process (no thread pools competing); the driver alternates
rounds (bert_jax, transformers, bert_jax, ...; --steps_per_round steps each, after
warm-up) and reports each round's median step time as useful (non-padding) tokens/s, the
ratio of each pair and the medians. With --parity (default) transformers starts from our
initial weights (modern_formats.params_to_hf) and both losses of the first batch must agree.

MFU is against the run's measured float32 matmul peak (bench.peers.train_step.matmul_peak, the
best of the probes run between rounds). Two FLOP counts: the trainer's (objective.flops:
every row position as a token, global layers over the whole row, all 328 prediction slots;
includes padding and cross-example work that the masks discard) and useful work (the sum
over examples of modern_formats.forward_flops at each example's length and
predictions, x3). Also prints the attention FLOPs of ModernBERT-base at --attn_len
(default 8192): executed by the banded local layers + dense global layers vs all layers
dense. Appends to bench/results/peers.md unless --no_record or --smoke.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np

from bench import harness

from bench.peers.modern_sides import TORCH_MODES, Remote, make_steps, model_config


# ----------------------------------------------------------------------------
# FLOPs.

def global_path(cfg, batch: dict) -> tuple[float, bool]:
  """Share of the global layers' block pairs that the step's packed rows need
  (modern.block_pairs_needed in numpy) and whether modern.packed_global_attention's budget
  holds them (else its dense fallback runs)."""
  seg = np.asarray(batch["packed_example_ids"])
  rows, length = seg.shape
  w = min(cfg.global_block, length)
  n = -(-length // w)
  blocks = np.pad(seg, [(0, 0), (0, n * w - length)]).reshape(rows, n, w)
  lo = np.where(blocks > 0, blocks, np.iinfo(np.int32).max).min(-1)
  hi = np.where(blocks > 0, blocks, 0).max(-1)
  need = (np.maximum(lo[:, :, None], lo[:, None, :]) <= np.minimum(hi[:, :, None], hi[:, None, :])).sum()
  budget = cfg.global_block_budget
  pairs = max(1, int(math.ceil(budget * rows * n * n)))
  fits = 0 < budget and pairs < rows * n * n and need <= pairs
  return float(need) / (rows * n * n), bool(fits)


def useful_flops(cfg, step: dict) -> float:
  """Forward + backward matmul FLOPs of the step's examples, each at its own length."""
  from bert_jax.models import modern_formats
  return float(sum(3 * modern_formats.forward_flops(
      cfg, len(e["input_ids"]), len(e["masked_lm_positions"])) for e in step["examples"]))


def attention_at(length: int, budget: float) -> dict:
  """ModernBERT-base's attention FLOPs over one sequence of `length`: executed by ours
  (banded local layers, dense global layers), the exact band, every layer dense, and
  executed with the global layers' block-pair `budget` (when a packed batch fits it)."""
  from bert_jax.models import modern
  from bert_jax.models import modern_attention
  cfg = modern.ModernConfig.from_preset("modernbert-base")  # global_block_budget 0: dense
  executed = modern_attention.attention_flops(cfg, length, executed=True)
  band = modern_attention.attention_flops(cfg, length, executed=False)
  dense = modern_attention.attention_flops(cfg.replace(global_every=1), length)
  budgeted = modern_attention.attention_flops(cfg.replace(global_block_budget=budget), length,
                                       executed=True)
  return dict(L=length, layers=cfg.num_layers, globals=sum(map(cfg.is_global, range(cfg.num_layers))),
              executed=executed, band=band, dense=dense, budget=budget, budgeted=budgeted)


# ----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="modernbert-base")
  parser.add_argument("--layers", type=int, default=None, help="num_layers (default: preset's)")
  parser.add_argument("--seq_len", type=int, default=1024)
  parser.add_argument("--rows", type=int, default=1, help="packed rows a step")
  parser.add_argument("--preds", type=int, default=320, help="max_predictions_per_seq")
  parser.add_argument("--examples_per_row", type=int, default=8)
  parser.add_argument("--mask_prob", type=float, default=0.3)
  parser.add_argument("--median_len", type=float, default=300)
  parser.add_argument("--sigma", type=float, default=1.0, help="of the log length")
  parser.add_argument("--min_len", type=int, default=16)
  parser.add_argument("--batches", type=int, default=3, help="distinct steps, cycled")
  parser.add_argument("--pairs", type=int, default=8, help="measured (ours, theirs) rounds")
  parser.add_argument("--steps_per_round", type=int, default=1)
  parser.add_argument("--warmup", type=int, default=1, help="steps of each side (each torch mode) first")
  parser.add_argument("--torch_modes", default="packed_mask,bucketed,per_example",
                      help=f"candidates among {TORCH_MODES} (padded: all examples padded to the "
                      "longest, several times the tokens and memory of the others)")
  parser.add_argument("--select_steps", type=int, default=2,
                      help="timed steps of each torch mode (round-robin) before the race")
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--peak_n", type=int, default=2048)
  parser.add_argument("--attn_len", type=int, default=8192)
  parser.add_argument("--global_block_budget", type=float, default=None,
                      help="bert_jax's model.global_block_budget (default: the config's)")
  parser.add_argument("--lr", type=float, default=8e-4)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--parity", action=argparse.BooleanOptionalAction, default=True,
                      help="transformers starts from our weights; first-batch losses must agree")
  parser.add_argument("--smoke", action="store_true", help="tiny model, seconds")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--section_to", default="", help="also write the RESULTS.md section here")
  return parser


def _options(args) -> dict:
  """The workload's and both sides' options (make_steps, Ours, Theirs); --smoke shrinks
  them and the race (in `args`)."""
  opts = dict(preset=args.preset, num_layers=args.layers, seq_len=args.seq_len, rows=args.rows,
              preds=args.preds, examples_per_row=args.examples_per_row, mask_prob=args.mask_prob,
              median_len=args.median_len, sigma=args.sigma, min_len=args.min_len,
              batches=args.batches, seed=args.seed, threads=args.threads, peak_n=args.peak_n,
              lr=args.lr, global_block_budget=args.global_block_budget)
  if args.smoke:
    opts.update(preset="modernbert-tiny", num_layers=4, vocab_size=512, seq_len=128, preds=40,
                median_len=40, min_len=8, batches=2, peak_n=256)
    args.pairs, args.steps_per_round, args.select_steps = 2, 1, 1
  return opts


def _workload(opts: dict) -> dict:
  """The model config, the steps and what the report says of them."""
  cfg = model_config(opts)
  steps, stats = make_steps(opts, cfg.vocab_size)
  tokens = [s["tokens"] for s in steps]
  return dict(cfg=cfg, steps=steps, stats=stats, tokens=tokens,
              examples=[len(s["examples"]) for s in steps],
              fill=sum(tokens) / (len(steps) * opts["rows"] * opts["seq_len"]),
              paths=[global_path(cfg, s["batch"]) for s in steps])


def _check_losses(ours: Remote, theirs: Remote, modes: list[str], parity: bool) -> list[str]:
  """Every torch mode's first-batch loss agrees; with `parity`, at our initial weights, and
  with ours. The notes for the report."""
  notes = []
  if parity:
    path = os.path.join("/tmp", f"bench_modern_step_{os.getpid()}.npz")
    try:
      theirs("load", ours("export", path))
    finally:
      if os.path.exists(path):
        os.remove(path)
    want = ours("initial_loss", 0)
  else:
    want = None
  losses = {m: theirs("initial_loss", m, 0) for m in modes}
  ref = losses[modes[0]]
  for m, l in losses.items():  # every mode computes the same function
    assert abs(l - ref) <= 1e-4 * max(1.0, abs(ref)), (m, losses)
  if want is not None:
    assert abs(ref - want) <= 1e-3 * max(1.0, abs(want)), ("bert_jax vs transformers", want, ref)
    notes.append(f"first-batch loss at the same weights: bert_jax {want:.5f}, transformers "
                 + ", ".join(f"{m} {l:.5f}" for m, l in losses.items()))
  return notes


def _select(ours: Remote, theirs: Remote, modes: list[str], args) -> tuple[dict, str]:
  """Warm-up, then transformers' fastest mode: ({mode: its step time and inputs}, fastest)."""
  ours("run", 0, args.warmup)
  for m in modes:
    theirs("run", m, 0, args.warmup)
  picks = {m: [] for m in modes}
  for _ in range(args.select_steps):  # round-robin, as the race
    for m in modes:
      picks[m] += theirs("run", m, 0, 1)["times"]
  select = {m: dict(step_s=statistics.median(t), **theirs("describe", m, 0))
            for m, t in picks.items()}
  return select, min(select, key=lambda m: select[m]["step_s"])


def _race(ours: Remote, theirs: Remote, mode: str, tokens: list[int], args) -> tuple[list, float]:
  """--pairs alternating rounds over the steps: (a row a round, the matmul peak)."""
  rounds, peak = [], float("nan")  # no pairs: no peak (and no medians)
  for r in range(args.pairs):
    index = r % len(tokens)
    a = ours("run", index, args.steps_per_round)
    b = theirs("run", mode, index, args.steps_per_round)
    peak = ours("peak")
    ta, tb = statistics.median(a["times"]), statistics.median(b["times"])
    rounds.append(dict(pair=r + 1, batch=index, tokens=tokens[index], ours_s=ta, theirs_s=tb,
                       ours_tok_s=tokens[index] / ta, theirs_tok_s=tokens[index] / tb,
                       ratio=tb / ta, ours_loss=a["loss"], theirs_loss=b["loss"]))
    print(f"pair {r + 1}: batch {index}, {tokens[index]} useful tokens; bert_jax "
          f"{1e3 * ta:.0f} ms ({tokens[index] / ta:.0f} tok/s), transformers[{mode}] "
          f"{1e3 * tb:.0f} ms ({tokens[index] / tb:.0f} tok/s), ratio {tb / ta:.2f}x", flush=True)
  return rounds, peak


def _summary(work: dict, rounds: list[dict], peak: float, info_ours: dict, attn_len: int) -> dict:
  """Medians, MFUs (each round's FLOPs over its median step time) and attention FLOPs."""
  cfg = work["cfg"]
  med = lambda k: statistics.median(r[k] for r in rounds)
  step_flops_counted = info_ours["counted_flops"]
  useful = [useful_flops(cfg, s) for s in work["steps"]]
  return dict(
      ours_tok_s=med("ours_tok_s"), theirs_tok_s=med("theirs_tok_s"), ratio=med("ratio"),
      peak=peak,
      mfu_counted=statistics.median(step_flops_counted / r["ours_s"] / peak for r in rounds),
      mfu_useful=statistics.median(useful[r["batch"]] / r["ours_s"] / peak for r in rounds),
      mfu_theirs=statistics.median(useful[r["batch"]] / r["theirs_s"] / peak for r in rounds),
      attention=attention_at(attn_len, cfg.global_block_budget),
      counted_flops=step_flops_counted, useful_flops=useful)


def _setup_text(args, opts: dict, work: dict) -> str:
  cfg, stats, steps, paths = work["cfg"], work["stats"], work["steps"], work["paths"]
  tokens, examples, fill = work["tokens"], work["examples"], work["fill"]
  layers = cfg.num_layers
  return (f"{opts['preset']} shape ({layers} layers{' (cut from the preset: both sides)' if args.layers else ''}, "
          f"hidden {cfg.hidden_size}, {cfg.num_heads} heads, intermediate {cfg.intermediate_size}, "
          f"local window {cfg.local_window}, global every {cfg.global_every}, vocab {cfg.vocab_size}), "
          f"float32, L={opts['seq_len']}, {opts['rows']} packed rows a step (<= {opts['examples_per_row']} "
          f"examples, <= {opts['preds'] + opts['examples_per_row']} predictions a row), masking "
          f"{opts['mask_prob']:.0%}. Documents: log-normal lengths, median {opts['median_len']:g}, "
          f"sigma {opts['sigma']:g} (of ln length), >= {opts['min_len']}, truncated at {opts['seq_len']} "
          f"(sample: mean {stats['mean_len']:.0f}, p90 {stats['p90_len']:.0f}, "
          f"{stats['capped']:.0%} truncated). {len(steps)} distinct steps cycled: useful tokens "
          f"{tokens}, examples {examples}, row fill {fill:.3f}. {args.pairs} alternating pairs x "
          f"{args.steps_per_round} steps after warm-up; {opts['threads']} threads each side, "
          f"each side in its own process. bert_jax's global layers: config budget "
          f"{cfg.global_block_budget:g} of the {cfg.global_block}-token block pairs; the steps need "
          + ", ".join(f"{f:.2f}" for f, _ in paths) + " of them -> "
          + ", ".join("block pairs" if ok else "dense fallback" for _, ok in paths) + ".")


def _report(args, opts: dict, result: dict) -> str:
  """The report: setup, transformers' modes, the pairs' table, MFU and attention FLOPs."""
  rounds, select, notes = result["rounds"], result["select"], result["notes"]
  info_theirs = result["info_theirs"]
  med = lambda k: statistics.median(r[k] for r in rounds)
  lines = [f"Setup: {_setup_text(args, opts, result['work'])}", "",
           f"transformers {info_theirs['transformers']} / torch {info_theirs['torch']}: "
           f"ModernBertForMaskedLM, attn_implementation={info_theirs['attn']}, sparse_prediction, "
           f"AdamW (fused={info_theirs['fused_adamw']}) + clip_grad_norm_(1.0). Ways of feeding it "
           f"the step (median of {args.select_steps} round-robin steps each, batch 0): "
           + "; ".join(f"{m} {1e3 * v['step_s']:.0f} ms ({v['calls']} call(s), "
                       f"{v['padded_tokens']} tokens incl. padding)" for m, v in select.items())
           + f" -> raced: **{result['mode']}**.", ""]
  lines += [f"{n}." for n in notes]
  if notes:
    lines.append("")
  lines += ["| pair | batch | useful tokens | bert_jax step ms | bert_jax tok/s | transformers step ms "
            "| transformers tok/s | bert_jax / transformers |", "|---|---|---|---|---|---|---|---|"]
  for r in rounds:
    lines.append(f"| {r['pair']} | {r['batch']} | {r['tokens']} | {1e3 * r['ours_s']:.0f} | "
                 f"{r['ours_tok_s']:.0f} | {1e3 * r['theirs_s']:.0f} | {r['theirs_tok_s']:.0f} | "
                 f"{r['ratio']:.2f}x |")
  lines.append(f"| **median** | | | {1e3 * med('ours_s'):.0f} | **{result['ours_tok_s']:.0f}** | "
               f"{1e3 * med('theirs_s'):.0f} | **{result['theirs_tok_s']:.0f}** | **{result['ratio']:.2f}x** |")
  return "\n".join(lines + ["", _flops_text(args, opts, result)])


def _flops_text(args, opts: dict, result: dict) -> str:
  """The report's MFU and attention FLOPs paragraphs."""
  info_ours, attn, peak = result["info_ours"], result["attention"], result["peak"]
  useful, step_flops_counted = result["useful_flops"], result["counted_flops"]
  return "\n".join([
      f"Matmul peak (float32, {opts['peak_n']}^2 through JAX, best of {args.pairs + 1} probes "
      f"in this run): {peak / 1e9:.1f} GFLOP/s. bert_jax MFU: {100 * result['mfu_counted']:.1f}% counting "
      f"the trainer's FLOPs ({step_flops_counted / 1e9:.0f} GFLOP/step: whole rows incl. "
      f"padding, global attention across the packed examples, all prediction slots; XLA "
      f"cost analysis {info_ours['xla_flops'] / 1e9:.0f} GFLOP), {100 * result['mfu_useful']:.1f}% "
      f"counting useful work only (each example at its own length: "
      f"{', '.join(f'{u / 1e9:.0f}' for u in useful)} GFLOP/step); transformers at the same "
      f"useful FLOPs: {100 * result['mfu_theirs']:.1f}%. bert_jax compile {info_ours['compile_s']:.0f} s, "
      f"{info_ours['params'] / 1e6:.1f}M parameters.",
      "",
      f"Attention FLOPs of modernbert-base ({attn['layers']} layers, {attn['globals']} global) "
      f"over one sequence of L={attn['L']}: executed by bert_jax (local layers banded, 3 "
      f"blocks of 64 keys per query block; global dense) {attn['executed'] / 1e12:.2f} TFLOP "
      f"vs every layer dense {attn['dense'] / 1e12:.2f} TFLOP: **{attn['dense'] / attn['executed']:.2f}x** "
      f"fewer (the exact band, 129 keys a query, would be {attn['band'] / 1e12:.2f} TFLOP, "
      f"{attn['dense'] / attn['band']:.2f}x; with global layers over packed rows at the "
      f"config's block-pair budget {attn['budget']:g}, when a batch fits it: "
      f"{attn['budgeted'] / 1e12:.2f} TFLOP, {attn['dense'] / attn['budgeted']:.2f}x)."])


def _record(args, argv, info_ours: dict, text: str) -> str:
  """The RESULTS.md section; written to --section_to, and appended unless --smoke/--no_record."""
  cmd = "python -m bench.peers.modern_step " + " ".join(argv if argv is not None else os.sys.argv[1:])
  section = (f"\n## ModernBERT pre-training step vs transformers ({time.strftime('%Y-%m-%d')})\n\n"
             f"Command: `{cmd.strip()}`  \nMachine: {harness.machine()}; {os.cpu_count()} cores (shared), "
             f"load average at the end {os.getloadavg()[0]:.1f}; jax {info_ours['jax']} "
             f"({info_ours['device']}).\n\n{text}\n")
  if args.section_to:
    with open(args.section_to, "w") as f:
      f.write(section)
  if not (args.smoke or args.no_record):
    harness.append(__name__, section)
  return section


def main(argv=None) -> dict:
  parser = _parser()
  args = parser.parse_args(argv)
  opts = _options(args)
  modes = [m for m in args.torch_modes.split(",") if m]
  unknown = set(modes) - set(TORCH_MODES)
  if unknown:
    parser.error(f"--torch_modes: unknown {sorted(unknown)}; choose from {TORCH_MODES}")
  work = _workload(opts)
  ours = Remote("bert_jax", opts, work["steps"])
  theirs = Remote("transformers", opts, work["steps"])
  try:
    notes = _check_losses(ours, theirs, modes, args.parity)
    select, mode = _select(ours, theirs, modes, args)
    rounds, peak = _race(ours, theirs, mode, work["tokens"], args)
  finally:
    info_ours, info_theirs = ours.info, theirs.info
    ours.close()
    theirs.close()
  summary = _summary(work, rounds, peak, info_ours, args.attn_len)
  result = dict(rounds=rounds, mode=mode, select=select, ours_tok_s=summary["ours_tok_s"],
                theirs_tok_s=summary["theirs_tok_s"], ratio=summary["ratio"], peak=peak,
                mfu_counted=summary["mfu_counted"], mfu_useful=summary["mfu_useful"],
                mfu_theirs=summary["mfu_theirs"], attention=summary["attention"],
                info_ours=info_ours, info_theirs=info_theirs, fill=work["fill"],
                tokens=work["tokens"], examples=work["examples"], stats=work["stats"],
                notes=notes, counted_flops=summary["counted_flops"],
                useful_flops=summary["useful_flops"])
  text = _report(args, opts, dict(result, work=work))
  print(text)
  result["text"] = text
  result["section"] = _record(args, argv, info_ours, text)
  return result


if __name__ == "__main__":
  main()
