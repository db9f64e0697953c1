r"""python -m bert_jax.main --config=configs/base_pretrain.py --workdir=$WORKDIR
  python -m bert_jax.main --config=configs/base_pretrain.py:phase2 --workdir=$WORKDIR

BERT-base pre-training, the paper's recipe (Devlin et al. 2018, appendix A.2).
Batch 256, Adam(W) lr 1e-4 (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01), 10k
warmup steps then linear decay over 1M steps. Phase 1 runs the first 90% of the
steps at sequence length 128 with 20 predictions; phase 2 (`:phase2`, same
workdir) resumes from phase 1's last checkpoint and runs the last 10% at 512/76,
continuing the same schedule. Variants (comma-separated after the colon):

  lamb    LAMB at batch 32k (You et al. 2019, "76 minutes"): lr 5e-3, warmup 1/5 of
          15,625 steps, 90% / 10% at 128 / 512, for TPU pods. `:lamb,phase2` after.
"""
import ml_collections

from bert_jax.configs import default

PHASE1_FRACTION = 0.9


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = set(filter(None, (arg or "").split(",")))
  unknown = variants - {"phase2", "lamb"}
  if unknown:
    raise ValueError(f"Unknown variants {sorted(unknown)}; use phase2 and/or lamb.")
  c = default.get_config()
  c.model.preset = "base"
  if "lamb" in variants:
    c.global_batch_size = 32_768
    c.eval_batch_size = 1024
    c.opt.name = "lamb"
    c.opt.learning_rate = 5e-3  # You et al. 2019 at 32k (square-root scaling from 512)
    c.opt.bias_correction = True
    c.schedule.decay_steps = 15_625  # 1M steps x 256 / 32k
    c.schedule.warmup_steps = 3_125  # warmup ratio 1/5 at 32k
    c.checkpoint_every_steps = 500
    c.keep_checkpoint_period = 5_000
    c.log_every_steps = 10
    c.eval_every_steps = 1_000
  total = c.schedule.decay_steps
  c.num_train_steps = round(PHASE1_FRACTION * total)
  if "phase2" in variants:
    c.num_train_steps = total  # the last 10% of the same schedule
    c.data.max_seq_length = 512
    c.data.max_predictions_per_seq = 76
  return c
