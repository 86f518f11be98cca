"""The ``sparseety`` command line: click commands over the library.

``main`` is the command group (replay, streams, show, export, errors, prune);
``run``, ``verify``/``tokenize`` and ``stats``/``diff``/``probe`` live in
their own modules; ``common`` holds the shared options and error handling.
"""

# First: the quick exit's handler must be registered before any library's.
from sniffer.cli import exiting  # noqa: F401
from sniffer.cli.main import entry_point, main

__all__ = ["entry_point", "main"]
