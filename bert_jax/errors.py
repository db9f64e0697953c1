"""Errors a user can fix from the message alone, and how entry points report them.

An entry point wrapped in `reported` prints such an error as one line (`PROG: error: ...`,
no traceback) and exits with status 2; every other exception keeps its traceback.
"""
import functools
import os
import sys


class UserError(Exception):
  """Bad input or a missing install: the message names the problem and what to do."""


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
