"""The old way, for comparison: a forwarding proxy in the request path.

``python bench/proxy.py --listen 18600 --upstream 18500 --log chunks.jsonl``

A small asyncio TCP/HTTP relay: every connection to ``--listen`` is forwarded
to ``127.0.0.1:--upstream``; every piece the server streams back is logged as
one JSON line (capture time, connection, bytes as text) before it is
forwarded to the client, the way a logging proxy of an LLM server works. It
is not part of sparseety: bench_live.py measures what it costs serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import IO


class Proxy:
    def __init__(self, upstream: int, log: IO[str]) -> None:
        self.upstream = upstream
        self.log = log
        self.conns = 0

    async def handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.conns += 1
        conn = self.conns
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            cw.close()
            return

        async def up() -> None:
            try:
                while data := await cr.read(65536):
                    sw.write(data)
                    await sw.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                if sw.can_write_eof():
                    sw.write_eof()

        async def down() -> None:
            try:
                while data := await sr.read(65536):
                    rec = {"ts": time.time(), "conn": conn, "text": data.decode("utf-8", "replace")}
                    self.log.write(json.dumps(rec) + "\n")
                    cw.write(data)
                    await cw.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                cw.close()

        await asyncio.gather(up(), down())
        sw.close()


async def serve(listen: int, upstream: int, log_path: str) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
        proxy = Proxy(upstream, log)
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument("--log", default="proxy_chunks.jsonl")
    a = p.parse_args()
    asyncio.run(serve(a.listen, a.upstream, a.log))


if __name__ == "__main__":
    main()
