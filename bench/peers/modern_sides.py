"""The two sides of bench/peers/modern_step.py, each in its own process: the workload they share
(numpy only; the driver builds it once and sends it to both), bert_jax's step (`Ours`),
transformers' (`Theirs`, in --torch_mode's layouts) and the pipe to a side's process
(`Remote`). bench/accel/gpu_step.py runs the same workload and transformers side on one GPU.
"""
from __future__ import annotations

import math
import multiprocessing
import time
import traceback

import numpy as np

CLS, SEP, MASK, FIRST_ID = 1, 2, 4, 5
TORCH_MODES = ("packed_mask", "padded", "bucketed", "bucketed_step", "per_example")


# ----------------------------------------------------------------------------
# The workload (numpy only; the driver builds it once and sends it to both sides).

def job_config(opts: dict):
  """configs/modern_pretrain.py set to the benchmarked model and data shape."""
  from bert_jax.configs import modern_pretrain
  config = modern_pretrain.get_config(opts["preset"])
  config.model.dtype = "float32"
  for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "local_window",
               "vocab_size", "max_position_embeddings", "global_block_budget"):
    if opts.get(name) is not None:
      setattr(config.model, name, opts[name])
  config.data.max_seq_length = opts["seq_len"]
  config.data.max_predictions_per_seq = opts["preds"]
  config.data.max_examples_per_row = opts["examples_per_row"]
  config.data.masked_lm_prob = opts["mask_prob"]
  config.global_batch_size = opts["rows"]
  return config


def model_config(opts: dict):
  """The ModernConfig the trainer builds (registry.model_config, without importing the
  input pipeline's TensorFlow here)."""
  from bert_jax.models import modern
  return modern.config_from_fields(dict(job_config(opts).model), None)


def make_steps(opts: dict, vocab: int) -> tuple[list[dict], dict]:
  """--batches distinct steps of --rows packed rows each, with their examples."""
  from input_pipeline import packing
  L, rows, n_steps = opts["seq_len"], opts["rows"], opts["batches"]
  P, E = opts["preds"], opts["examples_per_row"]
  P_row = P + E
  rng = np.random.default_rng(opts["seed"])
  open_rows = 16
  need = n_steps * rows + open_rows  # the last open rows may still be filling: unused
  lengths = np.zeros(0, np.int64)
  while True:  # enough documents for `need` rows
    more = np.exp(rng.normal(math.log(opts["median_len"]), opts["sigma"], 64))
    lengths = np.concatenate([lengths, np.clip(np.round(more), opts["min_len"], L).astype(np.int64)])
    if lengths.sum() > 1.2 * need * L:
      break
  n = len(lengths)
  ids = np.zeros((n, L), np.int32)
  mask = np.zeros((n, L), np.int32)
  pos = np.zeros((n, P), np.int32)
  lm_ids = np.zeros((n, P), np.int32)
  lm_w = np.zeros((n, P), np.float32)
  for i, m in enumerate(lengths):
    body = rng.integers(FIRST_ID, vocab, m - 2)
    ids[i, :m] = np.concatenate([[CLS], body, [SEP]])
    mask[i, :m] = 1
    k = min(int(math.floor(opts["mask_prob"] * (m - 2) + rng.random())), P)
    chosen = np.sort(rng.choice(np.arange(1, m - 1), k, replace=False))
    pos[i, :k], lm_ids[i, :k], lm_w[i, :k] = chosen, ids[i, chosen], 1.0
    r = rng.random(k)
    ids[i, chosen[r < 0.8]] = MASK
    swap = chosen[(r >= 0.8) & (r < 0.9)]
    ids[i, swap] = rng.integers(FIRST_ID, vocab, len(swap))
  feats = dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
               masked_lm_positions=pos, masked_lm_ids=lm_ids, masked_lm_weights=lm_w,
               next_sentence_labels=np.zeros(n, np.int32))
  row_of, *_ , num_rows = packing.assign_rows(
      lengths, (lm_w > 0).sum(-1), max_seq_length=L, max_examples_per_row=E,
      max_predictions_per_row=P_row, open_rows=open_rows)
  assert num_rows >= need, (num_rows, need)
  packed = packing.pack_examples(feats, L, E, P_row, open_rows=open_rows)
  steps = []
  for s in range(n_steps):
    lo, hi = s * rows, (s + 1) * rows
    batch = {k: v[lo:hi] for k, v in packed.items()}
    members = np.flatnonzero((row_of >= lo) & (row_of < hi))
    examples = []
    for i in members:
      m, k = int(lengths[i]), int((lm_w[i] > 0).sum())
      examples.append(dict(input_ids=ids[i, :m], masked_lm_positions=pos[i, :k],
                           masked_lm_ids=lm_ids[i, :k]))
    tokens = int(batch["input_mask"].sum())
    assert tokens == sum(len(e["input_ids"]) for e in examples)
    steps.append(dict(batch=batch, examples=examples, tokens=tokens,
                      predictions=int(batch["masked_lm_weights"].sum())))
  stats = dict(documents=n, mean_len=float(lengths.mean()),
               p90_len=float(np.percentile(lengths, 90)),
               capped=float((lengths == L).mean()))
  return steps, stats


# ----------------------------------------------------------------------------
# The two sides (each in its own process).

class Ours:
  """bert_jax: the trainer's jitted train step on the packed rows."""

  def __init__(self, opts: dict, steps: list[dict]):
    import jax
    from bert_jax import registry, trainer as trainer_lib
    from bench.peers import train_step as train_bench
    self.jax, self.opts = jax, opts
    self.peak_fn = lambda: train_bench.matmul_peak(opts["peak_n"])
    self.peaks = [self.peak_fn()]
    config = job_config(opts)
    model, objective, sample = registry.pretraining(config)
    self.cfg = model.config
    self.trainer = trainer_lib.build(config, model, objective, sample, workdir=None,
                                     devices=jax.devices()[:1])
    with self.trainer.activate():
      self.state = self.trainer.init()
      self.batches = [self.trainer.to_global(s["batch"]) for s in steps]
      self.rng = jax.random.key(0)
      t = time.perf_counter()
      self.step_fn = self.trainer.train_step.lower(self.state, self.batches[0], self.rng).compile()
      compile_s = time.perf_counter() - t
      shapes = {k: tuple(v.shape) for k, v in steps[0]["batch"].items()}
      self.info = dict(compile_s=compile_s, xla_flops=self._xla_flops(),
                       counted_flops=float(objective.flops(model, shapes)),
                       params=self.trainer.num_params(), jax=jax.__version__,
                       device=jax.devices()[0].device_kind)

  def _xla_flops(self) -> float:
    from bert_jax import flops as flops_lib
    try:
      return flops_lib.xla_flops(self.step_fn.fn)
    except Exception:  # pylint: disable=broad-except
      return float("nan")

  def initial_loss(self, index: int) -> float:
    with self.trainer.activate():
      sums = self.trainer.eval_step(self.state.params, self.batches[index], self.rng)
    return float(sums["mlm_loss_sum"]) / float(sums["mlm_weight"])

  def export(self, path: str) -> str:
    """Our initial weights as transformers' state dict (an .npz at `path`)."""
    from bert_jax.models import modern_formats
    state = modern_formats.params_to_hf(self.jax.device_get(self.state.params), self.cfg)
    np.savez(path, **state)
    return path

  def run(self, index: int, n: int) -> dict:
    times = []
    with self.trainer.activate():
      for _ in range(n):
        t = time.perf_counter()
        self.state, metrics = self.step_fn(self.state, self.batches[index], self.rng)
        self.jax.block_until_ready((self.state, metrics))
        times.append(time.perf_counter() - t)
    return dict(times=times, loss=float(metrics["loss"]))

  def peak(self) -> float:
    self.peaks.append(self.peak_fn())
    return max(self.peaks)


class Theirs:
  """transformers' ModernBertForMaskedLM + torch.optim.AdamW, fed the step's examples in
  one of TORCH_MODES."""

  def __init__(self, opts: dict, steps: list[dict]):
    import torch
    import transformers
    from bert_jax.models import modern_formats
    self.torch, self.opts = torch, opts
    torch.set_num_threads(opts["threads"])
    torch.manual_seed(0)
    cfg = model_config(opts)
    self.half = cfg.local_window // 2
    hf = modern_formats.config_to_hf(cfg, "ModernBertForMaskedLM")
    hf.pop("architectures", None)
    hf.update(pad_token_id=0, cls_token_id=CLS, bos_token_id=CLS, sep_token_id=SEP,
              eos_token_id=SEP, mask_token_id=MASK)
    hf_cfg = transformers.ModernBertConfig(**hf, sparse_prediction=True,
                                           attn_implementation="sdpa")
    self.model = transformers.ModernBertForMaskedLM(hf_cfg).train()
    try:
      self.opt = torch.optim.AdamW(self.model.parameters(), lr=opts["lr"], betas=(0.9, 0.98),
                                   eps=1e-6, weight_decay=1e-5, fused=True)
      self.fused = True
    except (RuntimeError, TypeError, ValueError):
      self.opt = torch.optim.AdamW(self.model.parameters(), lr=opts["lr"], betas=(0.9, 0.98),
                                   eps=1e-6, weight_decay=1e-5)
      self.fused = False
    self.L = opts["seq_len"]
    self.steps = steps
    self.inputs = {}  # (mode, index) -> list of (model kwargs, weight of its loss)
    self.info = dict(torch=torch.__version__, transformers=transformers.__version__,
                     threads=torch.get_num_threads(), fused_adamw=self.fused,
                     attn=self.model.config._attn_implementation)  # pylint: disable=protected-access

  def load(self, path: str) -> None:
    state = {k: self.torch.from_numpy(v) for k, v in np.load(path).items()}
    missing, unexpected = self.model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "decoder.weight" for k in missing), (missing, unexpected)
    # Fresh optimizer moments for the new weights.
    self.opt.state.clear()

  # --- the modes ---

  def _packed_mask(self, step: dict) -> list:
    torch, b = self.torch, step["batch"]
    seg = torch.from_numpy(b["packed_example_ids"]).long()
    pos = torch.from_numpy(b["position_ids"]).long()
    # Padding (segment 0) attends to padding only: never read by real tokens, no empty rows.
    same = seg[:, :, None] == seg[:, None, :]
    band = (pos[:, :, None] - pos[:, None, :]).abs() <= self.half
    labels = torch.full(seg.shape, -100, dtype=torch.long)
    w = b["masked_lm_weights"] > 0
    r, c = np.nonzero(w)
    labels[r, b["masked_lm_positions"][r, c]] = torch.from_numpy(b["masked_lm_ids"][r, c]).long()
    kwargs = dict(input_ids=torch.from_numpy(b["input_ids"]).long(), position_ids=pos,
                  labels=labels, attention_mask={"full_attention": same[:, None],
                                                 "sliding_attention": (same & band)[:, None]})
    return [(kwargs, 1.0)]

  def _grouped(self, step: dict, budget: float) -> list:
    """Examples sorted by length, in micro-batches of at most `budget` padded tokens (a
    lone example always fits), each padded to its longest; loss weights make the summed
    gradients those of the step's mean loss."""
    torch, exs = self.torch, step["examples"]
    order = sorted(range(len(exs)), key=lambda i: -len(exs[i]["input_ids"]))
    groups, cur = [], []
    for i in order:
      if cur and (len(cur) + 1) * len(exs[cur[0]]["input_ids"]) > budget:
        groups.append(cur)
        cur = []
      cur.append(i)
    groups.append(cur)
    total = step["predictions"]
    out = []
    for g in groups:
      longest = len(exs[g[0]]["input_ids"])
      ids = torch.zeros((len(g), longest), dtype=torch.long)
      mask = torch.zeros((len(g), longest), dtype=torch.long)
      labels = torch.full((len(g), longest), -100, dtype=torch.long)
      for j, i in enumerate(g):
        e = exs[i]
        m = len(e["input_ids"])
        ids[j, :m] = torch.from_numpy(e["input_ids"]).long()
        mask[j, :m] = 1
        labels[j, e["masked_lm_positions"]] = torch.from_numpy(e["masked_lm_ids"]).long()
      kwargs = dict(input_ids=ids, labels=labels)
      if len(g) > 1 and bool((mask == 0).any()):
        kwargs["attention_mask"] = mask
      out.append((kwargs, float((labels != -100).sum()) / total))
    return out

  def _inputs(self, mode: str, index: int) -> list:
    key = (mode, index)
    if key not in self.inputs:
      step = self.steps[index]
      if mode == "packed_mask":
        self.inputs[key] = self._packed_mask(step)
      else:
        budget = {"padded": float("inf"), "bucketed": self.L, "per_example": 0,
                  "bucketed_step": self.L * self.opts["rows"]}[mode]
        self.inputs[key] = self._grouped(step, budget)
    return self.inputs[key]

  def describe(self, mode: str, index: int) -> dict:
    parts = self._inputs(mode, index)
    return dict(calls=len(parts), padded_tokens=int(sum(k["input_ids"].numel() for k, _ in parts)))

  def initial_loss(self, mode: str, index: int) -> float:
    with self.torch.no_grad():
      return float(sum(w * self.model(**k).loss for k, w in self._inputs(mode, index)))

  def run(self, mode: str, index: int, n: int) -> dict:
    torch = self.torch
    parts = self._inputs(mode, index)
    times = []
    for _ in range(n):
      t = time.perf_counter()
      total = 0.0
      for kwargs, w in parts:
        loss = self.model(**kwargs).loss * w
        loss.backward()
        total += float(loss.detach())
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.opt.step()
      self.opt.zero_grad(set_to_none=True)
      times.append(time.perf_counter() - t)
    return dict(times=times, loss=total)


def _serve(conn, side: str, opts: dict, steps: list[dict]) -> None:
  try:  # on a shared machine, should memory run out, this process goes first
    with open("/proc/self/oom_score_adj", "w") as f:
      f.write("1000")
  except OSError:
    pass
  try:
    impl = (Ours if side == "bert_jax" else Theirs)(opts, steps)
    conn.send(("ok", impl.info))
    while True:
      name, args = conn.recv()
      if name == "stop":
        break
      conn.send(("ok", getattr(impl, name)(*args)))
  except BaseException:  # pylint: disable=broad-except
    conn.send(("error", traceback.format_exc()))
  finally:
    conn.close()


class Remote:
  """One side in a process of its own, called by method name."""

  def __init__(self, side: str, opts: dict, steps: list[dict]):
    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_serve, args=(child, side, opts, steps), daemon=True)
    self.proc.start()
    child.close()
    self.info = self._get()

  def _get(self):
    status, value = self.conn.recv()
    if status == "error":
      raise RuntimeError(value)
    return value

  def __call__(self, name: str, *args):
    self.conn.send((name, args))
    return self._get()

  def close(self) -> None:
    try:
      self.conn.send(("stop", ()))
    except OSError:
      pass
    self.proc.join(timeout=60)
