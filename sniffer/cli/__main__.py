"""``python -m sniffer.cli``: the ``sparseety`` command."""

from sniffer.cli.main import entry_point

entry_point()
