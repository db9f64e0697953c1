r"""Preparation split over the hosts of a TPU slice (or any N machines that share a bucket):
host i of N prepares its share of the input files, host 0 then merges the shares into
exactly the prepared corpus one machine writes (byte-identical arrays).

  # on every host (`bash launch/tpu.sh prepare` runs it on every worker of a slice):
  python -m input_pipeline.prepare_hosts --input='gs://b/c4/en/*.json.gz' \
      --vocab=gs://b/vocab --output_dir=gs://b/prepared/c4 --num_hosts=N --host_index=i

Its flags are prepare's (`python -m input_pipeline.prepare --help`) and --num_hosts,
--host_index and --merge_timeout.

Why not Apache Beam (the engine TFDS and SeqIO use): apache-beam 2.77 requires
protobuf < 7, and the pinned stack (TensorFlow 2.21, googleapis) runs on protobuf 7, so it
cannot be installed beside it; a TPU slice's hosts are the machines a TPU user already has.

Shares: the sorted file list (what one machine reads, in its order) is cut into N
contiguous ranges of about equal bytes (every range at least one file while there are as
many files as hosts). Host i prepares its range into OUTPUT_DIR/hosts/I-of-N, a prepared
corpus of one shard whose summary.json, written last, marks it complete; a rerun skips a
complete range. Host 0, after its own range, waits (--merge_timeout) for every other
range's summary.json, then deals the documents, range after range, to the --num_shards
shards as one machine does (corpus document g -> shard g % S), writes summary.json (counts
summed; bad records checked against --max_bad_records for the whole corpus; "hosts": N
added) and removes hosts/. A killed host leaves its range incomplete: rerun the same
command there, and on host 0 to merge.
"""
from __future__ import annotations

import datetime
import json
import time

from absl import flags
from absl import logging
import numpy as np

from common import errors
from common import fileio
from input_pipeline import prepare
from input_pipeline import sources
from input_pipeline import store
from input_pipeline import text as text_lib

HOSTS_DIR = "hosts"
_SUMMED = ("documents", "sentences", "tokens", "unk_tokens", "empty_documents",
           "input_files", "input_bytes", "replaced_bytes", "raw_documents", "bad_records")
_DEAL_DOCUMENTS = 65536  # documents dealt to the shards at a time while merging


def input_files(input_spec: str) -> list[str]:
  """The files one machine reads for `input_spec`, in its order."""
  if input_spec.strip() in ("default", "builtin") or input_spec.startswith("tfds:"):
    raise errors.UserError(f"--input={input_spec}: preparation split over hosts reads input "
                           "files (globs, local or gs://); prepare this corpus on one machine.")
  return text_lib.expand_patterns(input_spec, expand_dir=sources.dataset_files)


def ranges(sizes: list[int], num_hosts: int) -> list[tuple[int, int]]:
  """[start, stop) file indices of each host: contiguous, about equal bytes, at least one
  file each while there are enough files (empty ranges after the last file otherwise)."""
  n = len(sizes)
  ends = np.cumsum(np.asarray(sizes, np.float64) + 1.0)  # +1: empty files still count
  cuts = [0]
  for i in range(1, num_hosts):
    cut = int(np.searchsorted(ends, ends[-1] * i / num_hosts, side="left")) + 1
    lo, hi = cuts[-1] + (1 if cuts[-1] < n else 0), n - (num_hosts - i)
    cuts.append(min(max(cut, lo), max(hi, lo), n))
  cuts.append(n)
  return list(zip(cuts[:-1], cuts[1:]))


def part_dir(output_dir: str, host: int, num_hosts: int) -> str:
  return fileio.join(output_dir, HOSTS_DIR, f"{host:05d}-of-{num_hosts:05d}")


def _complete(path: str, spec: str) -> dict | None:
  summary = fileio.read_json(fileio.join(path, prepare.SUMMARY_NAME))
  return summary if summary is not None and summary.get("input") == spec else None


def prepare_share(input_spec: str, vocab_path: str, output_dir: str, *, num_hosts: int,
                  host_index: int, num_shards: int = 16, max_bad_records: int = 0,
                  merge_timeout: float = 86400.0, **kwargs) -> dict | None:
  """This host's range (module doc); on host 0 then the merge, whose summary it returns.
  `kwargs`: the other options of prepare.prepare_corpus."""
  if not 0 <= host_index < num_hosts:
    raise errors.ConfigError(f"--host_index={host_index} is not in [0, --num_hosts={num_hosts}): "
                             "give each host one index from 0 to --num_hosts - 1.")
  files = input_files(input_spec)
  sizes = [fileio.path(f).stat().length for f in files]
  share = ranges(sizes, num_hosts)
  start, stop = share[host_index]
  mine = ",".join(files[start:stop])
  path = part_dir(output_dir, host_index, num_hosts)
  if start == stop:
    logging.info("Host %d of %d: no input files left for this host (%d files).", host_index,
                 num_hosts, len(files))
  elif _complete(path, mine) is None:
    logging.info("Host %d of %d: preparing files %d..%d of %d into %s.", host_index,
                 num_hosts, start, stop - 1, len(files), path)
    prepare.prepare_corpus(mine, vocab_path, path, num_shards=1,
                           max_bad_records=max_bad_records, **kwargs)
  else:
    logging.info("Host %d of %d: %s is complete already.", host_index, num_hosts, path)
  if host_index != 0:
    return None
  specs = [",".join(files[a:b]) for a, b in share]
  return merge(input_spec, output_dir, specs, num_shards=num_shards,
               max_bad_records=max_bad_records, timeout=merge_timeout)


def _wait(output_dir: str, specs: list[str], timeout: float) -> list[dict | None]:
  deadline, parts = time.time() + timeout, [None] * len(specs)
  while True:
    for i, spec in enumerate(specs):
      if spec and parts[i] is None:
        parts[i] = _complete(part_dir(output_dir, i, len(specs)), spec)
    missing = [i for i, spec in enumerate(specs) if spec and parts[i] is None]
    if not missing:
      return parts
    if time.time() > deadline:
      raise errors.UserError(
          f"Hosts {missing} of {len(specs)} have not finished their share of the input after "
          f"{timeout:.0f} s (no summary.json in {fileio.join(output_dir, HOSTS_DIR)}): rerun "
          "the same prepare command on them, then on host 0 to merge.")
    time.sleep(min(10.0, max(0.1, timeout / 100)))


def merge(input_spec: str, output_dir: str, specs: list[str], *, num_shards: int,
          max_bad_records: int = 0, timeout: float = 86400.0) -> dict:
  """Deals the hosts' prepared ranges to `num_shards` shards (module doc)."""
  parts = _wait(output_dir, specs, timeout)
  done = [(i, p) for i, p in enumerate(parts) if p is not None]
  bad = sum(p["bad_records"] for _, p in done)
  if bad > max_bad_records:
    raise sources.BadRecordError(
        f"The hosts skipped {bad} bad records in all, more than --max_bad_records="
        f"{max_bad_records} for the whole corpus (each host allowed that many): raise it, or "
        "fix the records named in the hosts' logs.")
  with prepare.hold_output(output_dir):
    return _merge_parts(input_spec, output_dir, specs, done, num_shards)


def _merge_parts(input_spec: str, output_dir: str, specs: list[str],
                 done: list[tuple[int, dict]], num_shards: int) -> dict:
  first = done[0][1]
  summary_path = fileio.path(fileio.join(output_dir, prepare.SUMMARY_NAME))
  if summary_path.exists():
    summary_path.unlink()
  start = time.time()
  writer = store.ShardWriter(output_dir, num_shards, first["vocab"]["vocab_size"])
  g = 0
  try:
    for i, part in done:
      arrays = store.open_arrays(part_dir(output_dir, i, len(specs)), part)
      g = _deal_part(writer, arrays, g)
    shard_docs = writer.finish()
  finally:
    writer.discard()
  summary = {k: sum(p[k] for _, p in done) for k in _SUMMED}
  summary.update({
      "format_version": store.FORMAT_VERSION, "input": input_spec, "format": first["format"],
      "text_field": first["text_field"], "num_shards": num_shards, "files": list(store.FILES),
      "token_dtype": writer.dtype.name, "shard_documents": shard_docs, "vocab": first["vocab"],
      "hosts": len(specs),
      "seconds": round(max(p["seconds"] for _, p in done) + time.time() - start, 2),
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  })
  summary_path.write_text(json.dumps(summary, indent=2))
  fileio.path(fileio.join(output_dir, HOSTS_DIR)).rmtree()
  logging.info("Merged the shares of %d hosts into %s: %d documents, %d tokens.", len(specs),
               output_dir, summary["documents"], summary["tokens"])
  return summary


def _deal_part(writer: store.ShardWriter, arrays: dict, first_document: int) -> int:
  """Deals one range's documents (corpus documents first_document...) to the shards as
  prepare does; returns the next corpus document index."""
  doc_start, sent_start, tokens = (arrays["document_starts"], arrays["sentence_starts"],
                                   arrays["tokens"])
  n = len(doc_start) - 1
  for a in range(0, n, _DEAL_DOCUMENTS):
    b = min(a + _DEAL_DOCUMENTS, n)
    s0, s1 = int(doc_start[a]), int(doc_start[b])
    result = {"document_sentences": np.diff(doc_start[a:b + 1]).astype(np.int64),
              "sentence_lengths": np.diff(sent_start[s0:s1 + 1]).astype(np.int64),
              "tokens": np.asarray(tokens[int(sent_start[s0]):int(sent_start[s1])])}
    prepare.deal_documents(writer, result, first_document + a)
  return first_document + n


def main(argv: list[str]) -> dict | None:
  fv = prepare.flag_values()
  flags.DEFINE_integer("num_hosts", None, "Hosts preparing the corpus together.",
                       flag_values=fv)
  flags.DEFINE_integer("host_index", None, "This host's index, 0..num_hosts-1 (host 0 also "
                       "merges).", flag_values=fv)
  flags.DEFINE_float("merge_timeout", 86400.0, "Seconds host 0 waits for the other hosts' "
                     "shares.", flag_values=fv)
  errors.parse_flags(fv, argv, __doc__)
  errors.require_flags(fv, "input", "vocab", "output_dir", "num_hosts", "host_index")
  summary = prepare_share(fv.input, fv.vocab, fv.output_dir, num_hosts=fv.num_hosts,
                          host_index=fv.host_index, merge_timeout=fv.merge_timeout,
                          lowercase=fv.lowercase, num_shards=fv.num_shards,
                          num_workers=fv.num_workers, fmt=fv.format, text_field=fv.text_field,
                          max_replaced_fraction=fv.max_replaced_fraction,
                          max_bad_records=fv.max_bad_records)
  if summary is None:
    print(f"Host {fv.host_index} prepared its share of {fv.output_dir}; host 0 merges.")
  else:
    print(f"Prepared {fv.output_dir} on {fv.num_hosts} hosts:\n"
          f"{prepare.format_summary(summary)}")
  return summary


if __name__ == "__main__":
  errors.run_tool(main)
