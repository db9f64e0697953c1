"""Fields every job reads: seed, batch and step limits, optimizer, the end of the schedule,
mesh and sharding rules, checkpoints, logging. `configs/default.py` (pre-training) and
`configs/finetune.py` (fine-tuning) start from this and add their own fields only.
"""
import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "pretrain"  # bert_jax.main's job: pretrain | glue | custom | squad | conll | swag | embed | suite
  c.seed = 0  # parameter init, dropout and data order
  c.init_checkpoint = ""  # start from: HF dir, Google TF checkpoint, exported dir or our workdir

  # Batch and steps.
  c.global_batch_size = 256  # sequences per optimizer step, over all hosts
  c.eval_batch_size = 256  # sequences per evaluation batch, over all hosts
  c.grad_accum_steps = 1  # micro-batches per step (accumulated inside the jitted step)
  c.max_steps_per_run = -1  # >0: stop (with a checkpoint) after this many steps per process
  # XLA's persistent compilation cache: a resumed or repeated run loads its compiled programs.
  # "" = WORKDIR/xla_cache (or JAX_COMPILATION_CACHE_DIR when set); "none" = off.
  c.compilation_cache_dir = ""

  # Optimizer (bert_jax/optim.py).
  c.opt = ml_collections.ConfigDict()
  c.opt.name = "adamw"  # adamw (BERT) | stableadamw (update-clipped, ModernBERT) | lamb
  c.opt.learning_rate = 1e-4  # peak, after warmup
  c.opt.b1 = 0.9
  c.opt.b2 = 0.999
  c.opt.eps = 1e-6
  c.opt.bias_correction = False  # BERT's AdamWeightDecayOptimizer has none
  c.opt.weight_decay = 0.01  # decoupled; not on LayerNorm parameters or biases
  c.opt.grad_clip_norm = 1.0  # global-norm clipping; 0 = off

  # Learning-rate schedule: linear warmup, then linear decay to end_learning_rate (the
  # jobs add how long the warmup and the decay are).
  c.schedule = ml_collections.ConfigDict()
  c.schedule.end_learning_rate = 0.0

  # Parallelism: mesh over (data, fsdp, tensor); -1 = the remaining devices.
  c.mesh_shape = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # Logical axis name -> mesh axes, e.g. (("activation_batch", ("data", "fsdp")), ("embed",
  # "fsdp"), ...); unset: the model family's (bert_jax/sharding.py RULES, or its own).
  c.logical_axis_rules = config_dict.placeholder(tuple)

  # Checkpoints in workdir/checkpoints (Orbax, asynchronous).
  c.checkpoint_every_steps = 10_000  # 0 = off (saves still at the end, epoch ends, SIGTERM)
  c.keep_checkpoints = 3  # the newest N ...
  c.keep_checkpoint_period = 100_000  # ... plus every step divisible by this (0 = none)
  c.async_checkpointing = True

  # Logging.
  c.log_every_steps = 100  # 0 = off (a progress line at the end only)
  c.peak_flops_per_device = 0.0  # for MFU; 0 = known table / measured on CPU
  return c
