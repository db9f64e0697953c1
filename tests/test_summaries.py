"""TensorBoard event files written without TensorFlow (bert_jax/summaries.py), read back by
TensorFlow's own reader (which checks every record's CRC)."""
import numpy as np

from bert_jax import summaries
from tests import test_train_utils as tu


def test_crc32c_check_value():
  assert summaries.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
  assert summaries.crc32c(b"") == 0


def test_local_event_file_reads_in_tensorflow(tmp_path):
  writer = summaries.EventWriter(str(tmp_path))
  for step in (1, 2, 10**10):
    writer.write_scalars(step, {"train/loss": np.float32(step / 3), "train/lr": 1e-4})
  writer.close()
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
  loss = tu.read_scalars(tmp_path, "train/loss")
  assert sorted(loss) == [1, 2, 10**10]
  np.testing.assert_allclose(loss[2], 2 / 3, rtol=1e-6)
  assert tu.read_scalars(tmp_path, "train/lr")[1] == np.float32(1e-4)


def test_remote_writer_rewrites_whole_files_and_rolls_over(tmp_path, monkeypatch):
  """The gs:// mode (objects are written whole): values wait for flush (or remote_flush_s),
  and a file past its size limit is closed and a new one started; nothing is lost."""
  monkeypatch.setattr(summaries, "_REMOTE_FILE_BYTES", 300)
  writer = summaries.EventWriter(str(tmp_path), remote_flush_s=3600)
  writer.remote = True
  writer.write_scalars(0, {"a": 0.0})
  for step in range(1, 30):
    writer.write_scalars(step, {"a": float(step)})
  writer.flush()
  files = sorted(tmp_path.glob("events.out.tfevents.*"))
  assert len(files) > 1
  assert tu.read_scalars(tmp_path, "a") == {s: float(s) for s in range(30)}


def test_scalars_are_tf2_tensor_summaries(tmp_path):
  """As tf.summary.scalar (and clu, before) writes them: TensorBoard's tensor readers see
  them (the quickstart notebook reads them so), with the scalars plugin's metadata."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  writer = summaries.EventWriter(str(tmp_path))
  writer.write_scalars(7, {"train/loss": 2.5, "eval/mlm_accuracy": 0.125})
  writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path),
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  assert sorted(acc.Tags()["tensors"]) == ["eval/mlm_accuracy", "train/loss"]
  (e,) = acc.Tensors("train/loss")
  assert e.step == 7 and float(tensor_util.make_ndarray(e.tensor_proto)) == 2.5
  assert acc.SummaryMetadata("train/loss").plugin_data.plugin_name == "scalars"
