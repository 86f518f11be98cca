"""diff over 10,000 baseline/candidate stream pairs (synthetic rows via StoreWriter).

Writes 2 × N streams (one baseline and one candidate per prompt, chunked one
word per chunk, the candidate two words per chunk) into a temporary SQLite
database, then times loading + tokenizing (``load_outputs``) and the
comparison itself (``compute_diff``) separately, and the whole ``diff()``.
A share of the pairs (``--fork``) diverges at a random word, the rest are
identical; ``--words`` sets the output length. Edit distance is the
bit-parallel Myers/Hyyrö algorithm (see sniffer/reports/align.py): cost
O(n·⌈m/64⌉) word operations per divergent pair after stripping the common
prefix and suffix; identical pairs cost one comparison.

    python bench/bench_diff.py [--pairs 10000] [--words 120] [--fork 0.3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sniffer.core.events import (  # noqa: E402
    ChunkEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.tokens import TokenizerRegistry  # noqa: E402
from sniffer.llm.values import RequestSummary  # noqa: E402
from sniffer.reports.diff import compute_diff, diff  # noqa: E402
from sniffer.reports.stats import load_outputs  # noqa: E402
from sniffer.store.writer import StoreWriter, open_store  # noqa: E402

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "while",
    "river",
    "stones",
    "glitter",
    "under",
    "morning",
    "light",
    "and",
    "every",
    "small",
    "bird",
    "sings",
    "about",
    "distant",
    "mountains",
    "where",
    "old",
    "trees",
    "hold",
    "quiet",
    "stories",
]


def _stream(
    w: StoreWriter, sid: int, label: str, prompt: str, pieces: list[str], t0: float
) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": prompt}], "temperature": 0}
    w.write(
        StreamOpened(
            stream=sid,
            conn=sid,
            exchange=0,
            ts=t0,
            client=("127.0.0.1", 40000),
            server=("127.0.0.1", 8000),
            method="POST",
            path="/v1/chat/completions",
            request_headers=(),
            request_body=json.dumps(body),
            request=RequestSummary(model="fake", temperature=0.0, prompt_len=1),
            dialect="openai.chat",
            label=label,
        )
    )
    w.write(StreamResponse(sid, t0 + 0.001, 200, (), "text/event-stream", True))
    ts = t0 + 0.05
    for i, text in enumerate(pieces):
        w.write(ChunkEvent(sid, ts + i * 0.01, i, 0, i + 1, "content", text=text))
    end = ts + len(pieces) * 0.01
    w.write(ChunkEvent(sid, end, len(pieces), 0, 0, "finish", finish_reason="stop"))
    w.write(
        StreamClosed(
            stream=sid,
            ts=end,
            state=StreamState.COMPLETE,
            reason="bench",
            done_seen=True,
            gap=False,
            t_first_content=ts,
            t_last_chunk=end,
            chunk_count=len(pieces),
            event_count=len(pieces) + 1,
            text_len=sum(map(len, pieces)),
            finish_reasons=((0, "stop"),),
            usage=None,
            response_body=None,
        )
    )


def build(path: str, pairs: int, words: int, fork: float, seed: int) -> None:
    rng = random.Random(seed)
    with StoreWriter(path, batch_size=50_000) as w:
        sid = 1
        for p in range(pairs):
            base = [("" if i == 0 else " ") + rng.choice(WORDS) for i in range(words)]
            cand = list(base)
            if rng.random() < fork:
                at = rng.randrange(words)
                cand[at:] = [" " + rng.choice(WORDS) + "s" for _ in range(words - at)]
            merged = ["".join(cand[i : i + 2]) for i in range(0, len(cand), 2)]
            _stream(w, sid, "baseline", f"prompt {p}", base, 1000.0 + p)
            _stream(w, sid + 1, "sparse", f"prompt {p}", merged, 1000.0 + p)
            sid += 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument("--fork", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    registry = TokenizerRegistry()
    registry.preload()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        t = time.perf_counter()
        build(path, args.pairs, args.words, args.fork, args.seed)
        t_build = time.perf_counter() - t
        store = open_store(path)
        t = time.perf_counter()
        outputs = load_outputs(store, labels=["baseline", "sparse"], registry=registry)
        t_load = time.perf_counter() - t
        t = time.perf_counter()
        rep = compute_diff(outputs, "baseline", "sparse")
        t_cmp = time.perf_counter() - t
        t = time.perf_counter()
        full = diff(store, "baseline", "sparse", registry=registry)
        t_all = time.perf_counter() - t
    s = rep.summary
    tokens = sum(len(o.ids) for o in outputs)
    assert full.summary["pairs"] == s["pairs"] == args.pairs
    print(
        f"{args.pairs} pairs ({args.words} words per output, {tokens:,} tokens in all, "
        f"{s['pairs'] - s['identical_pairs']} divergent): write {t_build:.2f} s, "
        f"load+tokenize {t_load:.2f} s, compare {t_cmp:.2f} s "
        f"({s['pairs'] / t_cmp:,.0f} pairs/s), diff() end to end {t_all:.2f} s"
    )
    print(
        f"identical_ratio {s['identical_ratio']:.3f}, median first divergence "
        f"{s['median_first_divergence']}, mean edit ratio {s['mean_edit_ratio']:.3f}, "
        f"tokens/chunk ratio {s['tokens_per_chunk_ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
