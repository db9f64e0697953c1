r"""python -m bert_jax.main --config=configs/large_pretrain.py --workdir=$WORKDIR
  python -m bert_jax.main --config=configs/large_pretrain.py:phase2 --workdir=$WORKDIR
  python -m bert_jax.main --config=configs/large_pretrain.py:lamb --workdir=$WORKDIR

BERT-large pre-training, the paper's recipe; phases and variants as base_pretrain.py.
24 layers, hidden 1024, 16 heads (340M parameters). Parameters and optimizer
state are sharded over `fsdp` (a 1.3 GB float32 model + 2.7 GB of Adam moments
does not want to be replicated on every chip), and layers are rematerialised.
"""
import ml_collections

from bert_jax.configs import base_pretrain


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = base_pretrain.get_config(arg)
  c.model.preset = "large"
  c.model.remat = "dots"
  c.model.scan_layers = True
  c.mesh_shape.data = 1
  c.mesh_shape.fsdp = -1
  return c
