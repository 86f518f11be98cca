"""Cause classes and reference-model scoring: how fast, on this machine.

Prints: pairs classified per second (crafted outputs with logprobs and top-5
alternatives at every token), and the tiny random Llama of the tests scoring
diverged pairs (pairs and tokens per second, CPU, batched). Needs torch for the
second part (skipped without it).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sniffer.llm.tokens import TokenizerRegistry
from sniffer.reports.causes import classify
from sniffer.reports.stats import build_outputs

PAIRS = 2000
TOKENS = 200


def _lp(text: str, lp: float, alts: list[tuple[str, float]]) -> str:
    item = {"token": text, "logprob": lp, "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                             for t, v in alts]}  # fmt: skip
    return json.dumps({"content": [item]})


def bench_classify() -> None:
    rng = random.Random(0)
    words = [f" w{i}" for i in range(500)]
    rows, chunk_rows = [], []
    for p in range(PAIRS):
        base = [rng.choice(words) for _ in range(TOKENS)]
        fork = rng.randrange(1, TOKENS)
        cand = [*base[:fork], " zz", *base[fork + 1 :]]
        for sid, toks in ((2 * p + 1, base), (2 * p + 2, cand)):
            body = {"model": "m", "messages": [{"role": "user", "content": str(p)}]}
            rows.append({"id": sid, "label": "a" if sid % 2 else "b", "model": "m",
                         "request_json": json.dumps(body), "state": "complete",
                         "dialect": "openai.chat", "text_kept": True})  # fmt: skip
            for i, t in enumerate(toks):
                alts = [(t, -0.1), (" zz", -0.2), *((rng.choice(words), -3.0) for _ in range(3))]
                chunk_rows.append((sid, 0, t, float(i), None, _lp(t, -0.1, alts)))
    outs = build_outputs(rows, chunk_rows, TokenizerRegistry())
    t0 = time.perf_counter()
    causes = [classify(outs[i], outs[i + 1]).cause for i in range(0, len(outs), 2)]
    dt = time.perf_counter() - t0
    print(f"classify: {PAIRS} pairs of {TOKENS} tokens (top-5 logprobs) in {dt:.2f} s = "
          f"{PAIRS / dt:,.0f} pairs/s; {causes.count('near_tie')} near ties")  # fmt: skip


def bench_reference() -> None:
    try:
        import torch
    except ImportError:
        print("reference model: skipped (torch not installed)")
        return
    from sniffer.llm.reference import ReferenceModel, ScoreJob
    from tests.model_server import make_tiny_model

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        d = make_tiny_model(Path(tmp) / "m")
        ref = ReferenceModel(str(d))
        print(f"reference model: built and loaded in {time.perf_counter() - t:.1f} s "
              "(random Llama, hidden 128, 4 layers, vocab 129,280)")  # fmt: skip
        rng = random.Random(1)
        words = ["sea", "wind", "stone", "light", "river", "cloud", "salt", "glass"]
        jobs = []
        for i in range(32):
            common = " ".join(rng.choice(words) for _ in range(40))
            b = common + " " + " ".join(rng.choice(words) for _ in range(60))
            c = common + " zebra " + " ".join(rng.choice(words) for _ in range(60))
            req = json.dumps({"messages": [{"role": "user", "content": f"Tell me {i}"}]})
            jobs.append(ScoreJob(req, b, c))
        t = time.perf_counter()
        ref.score(jobs)
        dt = time.perf_counter() - t
        toks = sum(
            j.result["baseline"]["scored_tokens"] + j.result["candidate"]["scored_tokens"]
            for j in jobs
            if j.result and "error" not in j.result
        )
        passes = sum(j.result.get("fork_paths", 0) for j in jobs if j.result)
        print(f"reference model: {len(jobs)} pairs ({toks} continuation tokens) scored in "
              f"{dt:.2f} s = {len(jobs) / dt:.1f} pairs/s, {toks / dt:,.0f} tokens/s; "
              f"forks scored on text: {passes} token paths")  # fmt: skip


if __name__ == "__main__":
    bench_classify()
    bench_reference()
