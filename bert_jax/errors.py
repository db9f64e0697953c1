"""Errors a user can fix from the message alone, and how entry points report them.

An entry point wrapped in `reported` prints such an error as one line (`PROG: error: ...`,
no traceback) and exits with status 2; every other exception keeps its traceback.
"""
import functools
import os
import sys


class UserError(Exception):
  """Bad input or a missing install: the message names the problem and what to do."""


class ConfigError(UserError, ValueError):
  """A config value that cannot work: the message names the field and a value that does."""


class MissingDependencyError(UserError, ImportError):
  """A package that this path or feature needs is not installed."""


def reported(main):
  """Decorates a CLI `main`: a UserError becomes one line on stderr and exit status 2."""

  @functools.wraps(main)
  def wrapper(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except UserError as e:
      prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bert_jax"
      print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapper


_HELP = ("-h", "-?", "--help", "--helpshort", "--helpfull")


def _fail(message: str) -> None:
  prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bert_jax"
  print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def _innermost_text(e: BaseException) -> str:
  """The message of a config override error (ml_collections nests a KeyError whose text
  is the repr of the real message)."""
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]
  text = str(e.args[0]) if e.args else str(e)
  return text.strip("'\"") if text.count("\n") == 0 else text


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing for every entry point: `--help`/`-h` (`--helpfull`: every
  library's flags too) print the usage and exit 0; a bad flag or config override is one
  line (`PROG: error: ...`) and exit 2, never a traceback."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  asked = [a for a in argv[1:] if a.split("=")[0] in _HELP]
  if asked:
    app.usage(shorthelp=asked[0] != "--helpfull", writeto_stdout=True)
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
    if "config" in flags.FLAGS and flags.FLAGS["config"].present:
      flags.FLAGS.config.keys()  # config files load lazily: fail here, not mid-job
    return rest
  except OSError as e:  # a --config file that does not load
    given = [a for a in argv[1:] if a.startswith("--config=")]
    _fail(f"{given[0] if given else '--config'}: cannot load the config file: "
          f"{str(e).strip().splitlines()[-1].strip()}")
  except flags.Error as e:
    _fail(f"{e} (see --help)")
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # --config.x.y=... overrides
    text = _innermost_text(e)
    field = text.split("\n")[0].strip("'\"")
    where = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")
             and a.split("=")[0].split(".")[-1] == field]
    lead = f"{where[0]}: the config has no field {field!r}" if where else f"bad config override: {field}"
    hint = " ".join(line.strip() for line in text.split("\n")[1:])
    _fail(f"{lead}.{' ' + hint if hint else ''}")
  return argv


def run(main) -> None:
  """`absl.app.run(main)` with `parse_flags`; decorate `main` with `reported`."""
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=parse_flags)
