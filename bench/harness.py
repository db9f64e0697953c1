"""What every benchmark shares (standard library only: importable in every venv, the peers'
and the GPU's).

- `machine()`: the CPU line every table records.
- `child_env`, `run_child`, `child_row`, `emit`: a row measured in a child process. The child
  prints one `RESULT {json}` line (`emit`); the parent parses it, or fails with one error that
  ends with the child's log tail (`ChildError`; `child_row` turns it into an `{'error': ...}`
  row, so a table shows why a row is missing).
- `parser`, `child_spec`, `command`, `recording`: the argparse skeleton (--smoke, --no_record,
  the hidden --_child) and the command line a RESULTS section quotes.
- `results_file`, `section`, `record`: the results file of a benchmark's group
  (bench/results/GROUP.md) and the section appended to it ("## title (date)", the command,
  the machine, the body).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any, Sequence

BENCH = pathlib.Path(__file__).resolve().parent
REPO = str(BENCH.parent)
MARK = "RESULT "


def machine() -> str:
  """lscpu's model name and the SIMD/matrix flags that matter for XLA:CPU and oneDNN."""
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return "lscpu unavailable"
  info = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
  flags = info.get("Flags", "").split()
  shown = [f for f in flags if f.startswith(("avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
                                             "avx512_vnni", "amx", "avx2", "fma"))]
  return f"{info.get('Model name', '?').strip()}, {os.cpu_count()} cores; flags: {' '.join(shown)}"


def load_average() -> str:
  """The load average over 1 / 5 / 15 minutes."""
  try:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())
  except OSError:
    return "?"


def load_span(start: float) -> str:
  """The load average at the start (`start`, os.getloadavg()[0] then) and now."""
  return f"load average {start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"


# ----------------------------------------------------------------------------------------
# A row in a child process.


class ChildError(RuntimeError):
  """A child that timed out, failed or printed no result; `summary` is the one-line reason
  (a table's error cell), the message adds the command and the end of its log."""

  def __init__(self, summary: str, cmd: Sequence[str] = (), log: str = ""):
    detail = f"\n{log[-3000:]}" if log.strip() else ""
    super().__init__(f"{' '.join(map(str, cmd))}: {summary}{detail}")
    self.summary = summary


def emit(result: Any) -> None:
  """The child's side: its one result line."""
  print(MARK + json.dumps(result), flush=True)


def child_env(*pythonpath: str, keep_pythonpath: bool = False, drop: Sequence[str] = (),
              **extra: str) -> dict[str, str]:
  """os.environ with PYTHONPATH = `pythonpath` (then the caller's, with keep_pythonpath),
  TensorFlow's log quiet, the variables in `drop` removed and `extra` set."""
  paths = [*pythonpath, *([os.environ["PYTHONPATH"]] if keep_pythonpath and
                          os.environ.get("PYTHONPATH") else [])]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
  if paths:
    env["PYTHONPATH"] = os.pathsep.join(paths)
  for name in drop:
    env.pop(name, None)
  return env


def _text(out) -> str:
  return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def log_tail(text: str, lines: int = 3) -> str:
  """The line of the exception a child raised when there is one (a compiler's out-of-memory
  report follows it with pages of allocations), else its last `lines` lines, ' | '-joined."""
  kept = [l for l in text.strip().splitlines()
          if l.strip() and not l.startswith(("W0000", "WARNING", "I0000"))]
  raised = [l for l in kept if re.match(r"[\w.]+(Error|Exception): ", l)]
  return " | ".join(raised[-1:] or kept[-lines:])


def _result(out: str, err: str, mark: str) -> Any:
  """The JSON after the last line starting with `mark` (stdout, then stderr); with mark ""
  the last line of stdout. Raises ValueError when there is none."""
  if not mark:
    found = out.strip().splitlines()[-1:]
  else:
    found = [l for l in (out + "\n" + err).splitlines() if l.startswith(mark)][-1:]
  if not found:
    raise ValueError("no result line")
  return json.loads(found[0][len(mark):])


def run_child(cmd: Sequence[str], *, env: dict | None = None, cwd: str = REPO,
              timeout: float | None = None, mark: str = MARK, log: str = "",
              log_header: str = "") -> Any:
  """Runs `cmd` and returns the JSON of its result line (see `_result`); a timeout or no
  result (with mark "": a non-zero exit) raises ChildError. `log`: a file for its whole stdout and stderr (a
  timed-out child's too), after `log_header`."""
  proc = None
  try:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    out, err = proc.stdout, proc.stderr
  except subprocess.TimeoutExpired as e:
    out, err = _text(e.stdout), _text(e.stderr)
  if log:
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "w") as f:
      f.write(f"{log_header}--- stdout\n{out}\n--- stderr\n{err}")
  if proc is None:
    raise ChildError(f"timed out after {timeout:.0f} s", cmd, err or out)
  if mark or proc.returncode == 0:  # a result line counts even if the child's exit failed
    try:
      return _result(out, err, mark)
    except ValueError:
      pass
  tail = log_tail(err or out)[-400:]
  raise ChildError(f"exit {proc.returncode}: {tail}" if tail else f"exit {proc.returncode}",
                   cmd, err or out)


def child_row(cmd: Sequence[str], *, wall: bool = False, **kw) -> dict:
  """run_child's result as a table row: {'error': the reason} when it failed; with `wall`,
  the child's wall seconds as 'wall_s'."""
  t = time.perf_counter()
  try:
    row = run_child(cmd, **kw)
  except ChildError as e:
    return dict(error=e.summary)
  return dict(row, wall_s=time.perf_counter() - t) if wall else row


def module_child(module: str, spec: dict) -> list[str]:
  """The command that runs `python -m module --_child SPEC`."""
  return [sys.executable, "-m", module, "--_child", json.dumps(spec)]


# ----------------------------------------------------------------------------------------
# The command line and the results file.


def parser(doc: str | None, *, smoke: bool = True, record: bool = True,
           child: bool = False) -> argparse.ArgumentParser:
  """The skeleton: the module's docstring as --help, --smoke (tiny settings, seconds),
  --no_record (print, do not append to the results file), the hidden --_child SPEC."""
  p = argparse.ArgumentParser(description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  if smoke:
    p.add_argument("--smoke", action="store_true", help="tiny settings, seconds")
  if record:
    p.add_argument("--no_record", action="store_true",
                   help="print only: do not append to the results file")
  if child:
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
  return p


def child_spec(args: argparse.Namespace) -> dict | None:
  """The spec a --_child run was given, else None."""
  return json.loads(args._child) if getattr(args, "_child", "") else None  # pylint: disable=protected-access


def recording(args: argparse.Namespace) -> bool:
  """Whether the run appends its section: not --no_record, not --smoke."""
  return not getattr(args, "no_record", False) and not getattr(args, "smoke", False)


def command(module: str, argv: Sequence[str] | None) -> str:
  """`python -m MODULE ARGS` as the run was started (argv None: sys.argv)."""
  args = list(argv) if argv is not None else sys.argv[1:]
  return " ".join(["python -m", module, *args])


GROUPS = ("peers", "accel", "data", "quality")  # bench/GROUP/*.py -> bench/results/GROUP.md


def results_file(module: str) -> pathlib.Path:
  """The results file of a benchmark module's group: bench/results/GROUP.md for
  bench.GROUP.NAME (`__main__`: the module `python -m` ran)."""
  if module == "__main__":
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name if spec else module
  parts = module.split(".")
  if len(parts) != 3 or parts[0] != "bench" or parts[1] not in GROUPS:
    raise ValueError(f"{module} is not a benchmark of a group (bench.GROUP.NAME; GROUP in {GROUPS})")
  return BENCH / "results" / f"{parts[1]}.md"


def section(title: str, body: str, *, command: str | None = None, machine: str | None = None,  # pylint: disable=redefined-outer-name
            date: str | None = None) -> str:
  """"## TITLE (DATE)", the `Command:` and `Machine:` lines, then `body`."""
  lines = [f"## {title} ({date or datetime.date.today()})", ""]
  if command:
    lines.append(f"Command: `{command.strip()}`" + ("  " if machine else ""))
  if machine:
    lines.append(f"Machine: {machine}")
  return "\n" + "\n".join(lines) + ("\n\n" if len(lines) > 2 else "") + body.strip("\n") + "\n"


def append(module: str, text: str) -> None:
  """Appends `text` to the results file of `module`'s group (append only: other runs may be
  appending too)."""
  with open(results_file(module), "a", encoding="utf-8") as f:
    f.write(text)


def publish(module: str, text: str, record: bool) -> str:  # pylint: disable=redefined-outer-name
  """Prints a finished section, and appends it to `module`'s results file when `record`."""
  print(text)
  if record:
    append(module, text)
  return text


def record(module: str, title: str, body: str, **kw) -> str:
  """Appends `section(title, body, **kw)` to the results file of `module`'s group; returns it."""
  text = section(title, body, **kw)
  append(module, text)
  return text
