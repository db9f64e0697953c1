"""bench/peers/modern_step.py in its --smoke setting (no timing asserted): both sides train on the
same packed examples, every transformers feeding mode and bert_jax agree on the first loss
at the same weights, and the report holds the race and the attention FLOPs."""
import pytest

from bench.peers import modern_step


@pytest.mark.slow  # ~40 s: the default suite keeps to ~12 minutes on 2 cores
def test_modern_step_bench_smoke(capsys):
  res = modern_step.main(["--smoke", "--no_record"])
  out = capsys.readouterr().out
  assert len(res["rounds"]) == 2 and all(r["ours_tok_s"] > 0 and r["theirs_tok_s"] > 0
                                         for r in res["rounds"])
  assert res["mode"] in modern_step.TORCH_MODES
  assert res["notes"] and "first-batch loss at the same weights" in res["notes"][0]
  assert res["tokens"] == [r["tokens"] for r in res["rounds"]][:len(res["tokens"])]
  assert 0 < res["fill"] <= 1 and all(u > 0 for u in res["useful_flops"])
  attn = res["attention"]
  assert attn["L"] == 8192 and attn["dense"] > attn["executed"] > 0
  assert "| **median** |" in out and "Attention FLOPs of modernbert-base" in out


def test_packing_keeps_the_examples_of_each_step():
  opts = dict(preset="modernbert-tiny", num_layers=2, vocab_size=512, seq_len=128, rows=2,
              preds=40, examples_per_row=8, mask_prob=0.3, median_len=40, sigma=1.0,
              min_len=8, batches=3, seed=0)
  steps, stats = modern_step.make_steps(opts, 512)
  assert stats["capped"] > 0  # the long tail reaches the row length
  for s in steps:
    b = s["batch"]
    assert b["input_ids"].shape == (2, 128)
    assert s["tokens"] == int(b["input_mask"].sum()) == sum(len(e["input_ids"]) for e in s["examples"])
    assert s["predictions"] == sum(len(e["masked_lm_positions"]) for e in s["examples"])
    # Each example's tokens are those of its packed slot, in order.
    got = sorted(tuple(b["input_ids"][r][b["packed_example_ids"][r] == k])
                 for r in range(2) for k in range(1, 9) if (b["packed_example_ids"][r] == k).any())
    assert got == sorted(tuple(e["input_ids"]) for e in s["examples"])
