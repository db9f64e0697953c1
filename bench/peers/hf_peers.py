"""The HuggingFace peers of bench/peers/keras_peer.py's `real` run (each in its own venv, as a child
process): run_mlm's input path (the text tokenized, concatenated and cut into blocks of L by
`group_texts`, masked per batch by the 15% collator) into `BertForMaskedLM` + torch AdamW, or
`FlaxBertForMaskedLM` + optax AdamW in a jitted step. Standard library at import: the
frameworks are imported by the child that runs them.
"""
from __future__ import annotations

import os
import time

from bench import harness
from bench.peers.flax_peer import SIZES  # stdlib only: importable in every venv


def _result(**kw) -> None:
  harness.emit(kw)


def _grouped_blocks(spec: dict, tokenizer):
  """run_mlm's group_texts: every paragraph tokenized ([CLS] .. [SEP]), concatenated, cut
  into blocks of L (the remainder dropped)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  with open(spec["paragraphs"], encoding="utf-8") as f:
    texts = [t for t in f.read().split("\n") if t.strip()]
  need = spec["L"] * spec["batch"] * (spec["warmup"] + spec["steps"])
  ids, total = [], 0
  for i in range(0, len(texts), 1000):
    for seq in tokenizer(texts[i:i + 1000])["input_ids"]:
      ids.append(seq)
      total += len(seq)
    if total >= need:
      break
  flat = np.concatenate([np.asarray(s, np.int64) for s in ids])
  n = len(flat) // spec["L"]
  return flat[:n * spec["L"]].reshape(n, spec["L"])


def _hf_torch(spec: dict, cfg, tokenizer, blocks, stamps: list) -> tuple[float, float, str]:
  """transformers' BertForMaskedLM + torch AdamW on run_mlm's batches (its 15% collator);
  a stamp a step into `stamps`; (model build start, fit start, versions)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  B, steps = spec["batch"], spec["warmup"] + spec["steps"]
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15,
                                                          return_tensors="pt")
  t0 = time.perf_counter()
  model = transformers.BertForMaskedLM(cfg).train()
  no_decay = ("bias", "LayerNorm.weight")
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
        "weight_decay": 0.01},
       {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)],
        "weight_decay": 0.0}], lr=1e-4, eps=1e-6, fused=True)
  t_fit = time.perf_counter()
  for i in range(steps):
    batch = collator([{"input_ids": r} for r in blocks[i * B:(i + 1) * B].tolist()])
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    float(loss)
    stamps.append(time.perf_counter())
  versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
  return t0, t_fit, versions


def _hf_flax(spec: dict, cfg, tokenizer, blocks, stamps: list) -> tuple[float, float, str]:
  """transformers' FlaxBertForMaskedLM + optax AdamW in a jitted step on run_mlm_flax's
  batches; a stamp a step into `stamps`; (model build start, fit start, versions)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  B, steps = spec["batch"], spec["warmup"] + spec["steps"]
  t0 = time.perf_counter()
  model = transformers.FlaxBertForMaskedLM(cfg, seed=0, dtype=jnp.float32)
  params = model.params
  mask = jax.tree_util.tree_map_with_path(
      lambda path, _: not any(s in jax.tree_util.keystr(path) for s in ("LayerNorm", "bias")),
      params)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask))
  opt_state = tx.init(params)

  @jax.jit
  def step(p, o, ids, labels, rng):
    def loss_fn(p):
      logits = model(ids, params=p, dropout_rng=rng, train=True).logits
      w = (labels >= 0).astype(jnp.float32)
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.maximum(labels, 0)[..., None],
                                 -1)[..., 0]
      return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss
  t_fit = time.perf_counter()
  rng = np.random.default_rng(0)
  special = np.asarray([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id])
  for i in range(steps):  # run_mlm_flax's collator: 15% of non-special, 80/10/10
    ids = blocks[i * B:(i + 1) * B].copy()
    chosen = (rng.random(ids.shape) < 0.15) & ~np.isin(ids, special)
    labels = np.where(chosen, ids, -100)
    r = rng.random(ids.shape)
    ids = np.where(chosen & (r < 0.8), tokenizer.mask_token_id, ids)
    ids = np.where(chosen & (r >= 0.8) & (r < 0.9), rng.integers(0, spec["vocab"], ids.shape), ids)
    params, opt_state, loss = step(params, opt_state, ids.astype(np.int32),
                                   labels.astype(np.int32), jax.random.PRNGKey(i))
    float(loss)
    stamps.append(time.perf_counter())
  versions = f"transformers {transformers.__version__}, jax {jax.__version__}"
  return t0, t_fit, versions


def hf_child(spec: dict) -> None:
  import transformers  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.AutoTokenizer.from_pretrained(spec["tokenizer_dir"])
  blocks = _grouped_blocks(spec, tokenizer)
  layers, hidden, heads = SIZES[spec["preset"]]
  cfg = transformers.BertConfig(vocab_size=spec["vocab"], hidden_size=hidden,
                                num_hidden_layers=layers, num_attention_heads=heads,
                                intermediate_size=4 * hidden, max_position_embeddings=512)
  stamps = []
  run = _hf_torch if spec["impl"] == "torch" else _hf_flax
  t0, t_fit, versions = run(spec, cfg, tokenizer, blocks, stamps)
  elapsed = stamps[-1] - stamps[spec["warmup"] - 1]
  tokens = spec["batch"] * spec["L"] * spec["steps"]  # blocks hold no padding
  _result(step_s=elapsed / spec["steps"], useful_tok_s=tokens / elapsed, tok_s=tokens / elapsed,
          build_s=t_fit - t0, first_step_s=stamps[0] - t_fit, versions=versions)
