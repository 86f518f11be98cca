"""Serve the fixture app over h2c with hypercorn (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio

from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.fixture_server.app import make_app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    ns = p.parse_args()
    cfg = Config()
    cfg.bind = [f"127.0.0.1:{ns.port}"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.loglevel = "WARNING"
    asyncio.run(serve(make_app(), cfg))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
