"""The configs of every job (ml_collections config files), installed with bert_jax.

Run one by path: `python -m bert_jax.main --config=configs/tiny_pretrain.py` from the
repository root (`configs` there is this directory), or the path of this directory from
anywhere. They import their siblings as `bert_jax.configs.X`, so they load from any working
directory; a config file of your own, kept anywhere, builds on them the same way:

    from bert_jax.configs import base_pretrain

    def get_config(arg=None):
      c = base_pretrain.get_config(arg)
      c.data.prepared_dir = "gs://my-bucket/prepared"
      return c
"""
