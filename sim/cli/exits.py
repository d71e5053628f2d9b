"""How every `kvsim` command ends: its exit status, and bad input as one line on stderr.

Exit status, the same for every command:

* 0: done (for `check`: every expectation held; `fuzz`: nothing found);
* 1: a finding: a `check` expectation failed, `fuzz` found a violation, `shrink` found no
  such violation, `verify` found a divergence, every `sweep` point failed;
* 2: bad input: a scenario, `--set`, trace, profile, option value or output path that is
  wrong; one line on stderr naming the file, line and field (`sim.errors.InputError`);
* 3: an internal error, i.e. a bug in kvsim: its traceback on stderr;
* 130: interrupted (Ctrl-C); `kvsim run` says what was (not) written.

All of this is decided in one place, `KvsimGroup.invoke`: commands raise `InputError` for bad
input and never catch `ValueError` or `Exception` to make it look like input.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup
from typer.exceptions import TyperException

from sim.errors import InputError, one_line

EXIT_FINDING = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
#: The reader of stdout went away (`kvsim ... | head`): 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141


class _Console(Console):
    """rich's Console, but a closed pipe exits 141 (rich's default, 1, means "a finding" here)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError  # KvsimGroup.invoke: exit EXIT_BROKEN_PIPE, quietly


console = _Console(stderr=False)
err_console = Console(stderr=True)

#: Errors that are the user's input, reported as one line with exit status 2.
INPUT_ERRORS = (InputError,)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print `error: MESSAGE` (one line, at most `sim.errors.MAX_ERROR_CHARS`) and exit `code`."""
    err_console.print(
        f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True
    )
    return typer.Exit(code)


class KvsimGroup(TyperGroup):
    """Maps what a command raises to the exit status (see the module docstring)."""

    def invoke(self, ctx: Any) -> Any:  # typer's (vendored click) Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # typer's own: usage errors exit 2
            raise
        except InputError as error:
            raise fail(str(error)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            stdout_gone()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except Exception:  # noqa: BLE001 - anything else is a kvsim bug: show all of it
            traceback.print_exc(file=sys.stderr)
            err_console.print(
                "[bold red]internal error:[/] this is a bug in kvsim, not in your input; "
                "please report it with the traceback above",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INTERNAL) from None


def stdout_gone() -> None:
    """The reader closed the pipe: nothing more can be shown, and that is not a kvsim bug.

    stdout is pointed at /dev/null so that the interpreter's own final flush does not raise
    again (the recipe in Python's `signal` documentation, "Note on SIGPIPE").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
