"""The console script's quick exit: the exit handlers run, the teardown does not.

When a command is done, what Python would still do is run the ``atexit``
handlers (logging's, multiprocessing's, ``weakref.finalize``'s), flush the
standard streams, then free every module and object one by one, which after a
replay costs 0.1–0.25 s of CPU (issue #16). :func:`arm` asks for the first two
without the third: the process then exits the normal way up to its exit
handlers, and :func:`_end`, registered here before any other (``atexit`` runs
its handlers last registered first), runs after all of them, flushes the
standard streams and ends the process with the command's exit code.

Only the standard library is imported here, and ``sniffer.cli`` imports this
module first, so that every exit handler a command's libraries register comes
after ``_end`` and runs before it. A handler registered before ``sniffer.cli``
was imported would run after ``_end``, that is never, once armed: the console
script registers none.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["arm"]

_code: int | None = None


def arm(code: int) -> None:
    """End the process with ``code`` once the exit handlers have run."""
    global _code
    _code = code


def _end() -> None:
    if _code is None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        # The reader of stdout went away (``sparseety export | head``): quietly, 141.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os._exit(141)
    os._exit(_code)


atexit.register(_end)
