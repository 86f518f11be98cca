"""``python -m tests.fixture_server --host 127.0.0.1 --port 8000 [options]``.

Every option also reads an environment variable (shown in ``--help``); the model
name of a request overrides both (see :mod:`tests.fixture_server.app`).
"""

from __future__ import annotations

import argparse
import os

import uvicorn

from .app import FLAVOURS, STYLES, Options, make_app


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Options]:
    p = argparse.ArgumentParser(
        prog="python -m tests.fixture_server",
        description="Deterministic OpenAI-compatible streaming server (loopback fixtures). "
        "Example: python -m tests.fixture_server --port 8000 --style llamacpp --flavour cjk",
    )
    p.add_argument("--host", default=os.environ.get("FIXTURE_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=_env_int("FIXTURE_PORT") or 8000)
    p.add_argument(
        "--flavour",
        choices=FLAVOURS,
        default=os.environ.get("FIXTURE_FLAVOUR", "english"),
        help="text flavour [FIXTURE_FLAVOUR]",
    )
    p.add_argument(
        "--style",
        choices=STYLES,
        default=os.environ.get("FIXTURE_STYLE", "openai"),
        help="wire style of the stream [FIXTURE_STYLE]",
    )
    p.add_argument(
        "--tokens-per-chunk",
        type=int,
        default=_env_int("FIXTURE_TOKENS_PER_CHUNK") or 1,
        help="tokens per chunk [FIXTURE_TOKENS_PER_CHUNK]",
    )
    p.add_argument(
        "--delay-ms",
        type=float,
        default=float(os.environ.get("FIXTURE_DELAY_MS") or 0),
        help="delay between writes [FIXTURE_DELAY_MS]",
    )
    p.add_argument(
        "--perturb-after",
        type=int,
        default=_env_int("FIXTURE_PERTURB_AFTER"),
        help="different pieces from this piece index on [FIXTURE_PERTURB_AFTER]",
    )
    p.add_argument(
        "--fail-after",
        type=int,
        default=_env_int("FIXTURE_FAIL_AFTER"),
        help="send an error object after this many output chunks [FIXTURE_FAIL_AFTER]",
    )
    p.add_argument(
        "--reasoning",
        action="store_true",
        default=_env_flag("FIXTURE_REASONING"),
        help="reasoning_content deltas before content [FIXTURE_REASONING]",
    )
    p.add_argument(
        "--tool-calls",
        action="store_true",
        default=_env_flag("FIXTURE_TOOL_CALLS"),
        help="answer with a streamed function call [FIXTURE_TOOL_CALLS]",
    )
    p.add_argument(
        "--fffd",
        action="store_true",
        default=_env_flag("FIXTURE_FFFD"),
        help="split some multi-byte pieces into U+FFFD deltas [FIXTURE_FFFD]",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        default=_env_flag("FIXTURE_IGNORE_EOS"),
        help="always generate max_tokens tokens [FIXTURE_IGNORE_EOS]",
    )
    ns = p.parse_args(argv)
    opts = Options(
        flavour=ns.flavour,
        style=ns.style,
        tokens_per_chunk=ns.tokens_per_chunk,
        delay_ms=ns.delay_ms,
        perturb_after=ns.perturb_after,
        reasoning=ns.reasoning,
        tool_calls=ns.tool_calls,
        fail_after=ns.fail_after,
        fffd=ns.fffd,
        ignore_eos=ns.ignore_eos,
    )
    return ns, opts


def main(argv: list[str] | None = None) -> None:
    ns, opts = parse_args(argv)
    uvicorn.run(make_app(opts), host=ns.host, port=ns.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
