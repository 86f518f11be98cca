"""``diff --reference-model`` and the cause classes on a real baseline-vs-sparse pair.

A tiny random Llama (DESIGN.md "Real peers") is the baseline, served by a real
OpenAI-compatible streaming server on loopback (tests.model_server: greedy,
with logprobs); a copy with its smallest 2% projection weights zeroed is the
candidate. The traffic is recorded with dumpcap, replayed into SQLite, and
``diff --reference-model BASELINE_DIR`` must prefer the baseline's token at
every fork, with surprisals equal to a direct forward pass computed here; the
cause classes must match the two models' own distributions at the fork; ``stats``
over both servers under one label must explain the variants with the same
classes. Model-less tests: the one-line exit 2 without torch or with a model
directory that does not load, and prompt rendering per dialect.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sniffer.cli import main
from sniffer.llm.reference import prompt_messages

PROMPTS = [
    "Tell me about the sea",
    "What is 2+2?",
    "Write a poem about cats",
    "Explain gravity",
    "Hello there",
    "Why is the sky blue?",
]
MAX_TOKENS = 40
TOP = 5
MARGIN = 0.05  # nats: small enough that this pair shows both near ties and substantive forks
REPEAT = 2

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - install-deps installs it
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (pip install torch==2.13.0)")
needs_capture = pytest.mark.skipif(
    shutil.which("dumpcap") is None or os.geteuid() != 0,
    reason="needs root and dumpcap to record loopback",
)


# ---------------------------------------------------------------------------
# Without a model
# ---------------------------------------------------------------------------


def _empty_db(tmp_path: Path) -> str:
    from sniffer.store.writer import StoreWriter

    path = str(tmp_path / "e.db")
    StoreWriter(path).close()
    return path


def test_without_torch_one_line_and_exit_2(tmp_path: Path) -> None:
    db = _empty_db(tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "from sniffer.cli import main\n"
        f"main(['diff', '--db', {db!r}, '--baseline', 'a', '--candidate', 'b', "
        f"'--reference-model', {str(tmp_path)!r}])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("[transformers]")]
    assert lines == [
        "sparseety: --reference-model needs torch: pip install 'sparseety[reference]'"
    ], res.stderr


@needs_torch
def test_a_model_that_does_not_load_is_exit_2(tmp_path: Path) -> None:
    db = _empty_db(tmp_path)
    missing = tmp_path / "no-model"
    missing.mkdir()
    res = CliRunner().invoke(
        main,
        ["diff", "--db", db, "--baseline", "a", "--candidate", "b",
         "--reference-model", str(missing)],
    )  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.startswith(f"sparseety: reference model {str(missing)!r} does not load")
    assert len(res.stderr.strip().splitlines()) == 1


def test_prompt_rendering_inputs_per_dialect() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert prompt_messages({"messages": msgs}) == ([{"role": "user", "content": "Hi"}], None)
    assert prompt_messages({"system": "Be brief", "messages": msgs})[0] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hi"},
    ]
    assert prompt_messages({"instructions": "Sys", "input": "Q"})[0] == [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "Q"},
    ]
    assert prompt_messages({"prompt": "Once upon"}) == (None, "Once upon")
    assert prompt_messages({"prompt": ["Once upon"]}) == (None, "Once upon")
    assert prompt_messages({"inputs": "TGI text", "parameters": {}}) == (None, "TGI text")
    assert prompt_messages({"model": "x"}) == (None, None)


# ---------------------------------------------------------------------------
# The tiny real model (built once per session), served, captured, compared
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not HAVE_TORCH:
        pytest.skip("needs torch")
    import torch

    from tests.model_server import make_pruned_copy, make_tiny_model

    torch.set_num_threads(1)  # 2 shared cores: more threads only spin
    root = tmp_path_factory.mktemp("tiny-model")
    dense = make_tiny_model(root / "dense")
    return dense, make_pruned_copy(dense, root / "sparse")


def _poll(cond: Any, what: str, polls: int = 400) -> None:
    for _ in range(polls):  # × 0.025 s: a bound only reached when the test fails
        if cond():
            return
        time.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def recorded(
    tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Both models served on loopback, probed with logprobs, captured and replayed:
    ``db`` (labels dense / sparse) and ``node_db`` (both servers under one label)."""
    if shutil.which("dumpcap") is None or os.geteuid() != 0:
        pytest.skip("needs root and dumpcap to record loopback")
    from tests.dumpcap import wait_written_after
    from tests.fixture_server import free_port, wait_ready
    from tests.model_server import start_model_server

    tmp = tmp_path_factory.mktemp("reference")
    dense, sparse = tiny_models
    port_d, port_s = free_port(lo=21000, hi=21499), free_port(lo=21500, hi=21999)
    servers = [start_model_server(dense, port_d), start_model_server(sparse, port_s)]
    pcap = tmp / "ref.pcap"
    dumpcap: subprocess.Popen[bytes] | None = None
    try:
        for port in (port_d, port_s):
            wait_ready(port, timeout=90)
        dumpcap = subprocess.Popen(
            ["dumpcap", "-q", "-P", "-i", "lo", "-f", f"tcp port {port_d} or tcp port {port_s}",
             "-w", str(pcap)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _poll(lambda: pcap.exists() and pcap.stat().st_size >= 24, "the pcap header")

        def poke(port: int) -> None:
            """Everything sent so far is in the file (and capture is live)."""
            since = time.time()
            wait_written_after(pcap, since, lambda: wait_ready(port), "dumpcap to record")

        poke(port_d)
        prompts = tmp / "prompts.jsonl"
        prompts.write_text(
            "".join(
                json.dumps({"messages": [{"role": "user", "content": p}], "logprobs": True,
                            "top_logprobs": TOP}) + "\n"
                for p in PROMPTS
            ),
            encoding="utf-8",
        )  # fmt: skip
        for port in (port_d, port_s):
            res = CliRunner().invoke(
                main,
                ["probe", str(prompts), "--url", f"http://127.0.0.1:{port}", "--model", "tiny",
                 "--repeat", str(REPEAT), "--max-tokens", str(MAX_TOKENS), "--timeout", "60",
                 "--json"],
            )  # fmt: skip
            assert res.exit_code == 0, res.output
            assert json.loads(res.output)["ok"] == len(PROMPTS) * REPEAT
        poke(port_s)
    finally:
        if dumpcap is not None:
            dumpcap.send_signal(signal.SIGINT)
            dumpcap.wait(timeout=10)
        for s in servers:
            s.terminate()
            s.wait(timeout=10)
    out: dict[str, Any] = {"dense": dense, "sparse": sparse, "tmp": tmp}
    for name, labels in (
        ("db", [f"{port_d}=dense", f"{port_s}=sparse"]),
        ("node_db", [f"{port_d}=node", f"{port_s}=node"]),
    ):
        db = str(tmp / f"{name}.db")
        # --no-redact: the default PII redaction rewrites digit runs inside logprob
        # values (e.g. "-4.236954259872437" → "-4.<CARD>"); see the report
        args = ["replay", str(pcap), "--db", db, "-q", "--no-redact"]
        res = CliRunner().invoke(main, [*args, *(a for lb in labels for a in ("--label", lb))])
        assert res.exit_code == 0, res.output
        out[name] = db
    yield out


#: Without logprobs (the re-tokenized path): more prompts, for more forks.
PLAIN_PROMPTS = [
    *PROMPTS,
    "Name three colors",
    "How do birds fly?",
    "What is a prime number?",
    "Describe a forest",
    "Who wrote Hamlet?",
    "Count to ten",
    "Tell a joke",
    "Translate hello into French",
    "Summarize the news",
    "What time is it?",
]


@pytest.fixture(scope="module")
def recorded_plain(
    tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Both models served on loopback and probed WITHOUT logprobs (as
    ``transformers serve`` or any server not asked for them): only text reaches the
    sniffer, so the reference model re-tokenizes it. ``db``: labels dense / sparse."""
    if shutil.which("dumpcap") is None or os.geteuid() != 0:
        pytest.skip("needs root and dumpcap to record loopback")
    from tests.dumpcap import wait_written_after
    from tests.fixture_server import free_port, wait_ready
    from tests.model_server import start_model_server

    tmp = tmp_path_factory.mktemp("reference-plain")
    dense, sparse = tiny_models
    port_d, port_s = free_port(lo=22000, hi=22499), free_port(lo=22500, hi=22999)
    servers = [start_model_server(dense, port_d), start_model_server(sparse, port_s)]
    pcap = tmp / "plain.pcap"
    dumpcap: subprocess.Popen[bytes] | None = None
    try:
        for port in (port_d, port_s):
            wait_ready(port, timeout=90)
        dumpcap = subprocess.Popen(
            ["dumpcap", "-q", "-P", "-i", "lo", "-f", f"tcp port {port_d} or tcp port {port_s}",
             "-w", str(pcap)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _poll(lambda: pcap.exists() and pcap.stat().st_size >= 24, "the pcap header")
        since = time.time()
        wait_written_after(pcap, since, lambda: wait_ready(port_d), "dumpcap to record")
        prompts = tmp / "prompts.jsonl"
        prompts.write_text(
            "".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n"
                    for p in PLAIN_PROMPTS),
            encoding="utf-8",
        )  # fmt: skip
        for port in (port_d, port_s):
            res = CliRunner().invoke(
                main,
                ["probe", str(prompts), "--url", f"http://127.0.0.1:{port}", "--model", "tiny",
                 "--max-tokens", str(MAX_TOKENS), "--timeout", "60", "--json"],
            )  # fmt: skip
            assert res.exit_code == 0, res.output
            assert json.loads(res.output)["ok"] == len(PLAIN_PROMPTS)
        # every probe's packets in the file before the SIGINT
        since = time.time()
        wait_written_after(pcap, since, lambda: wait_ready(port_s), "dumpcap to record")
    finally:
        if dumpcap is not None:
            dumpcap.send_signal(signal.SIGINT)
            dumpcap.wait(timeout=10)
        for srv in servers:
            srv.terminate()
            srv.wait(timeout=10)
    db = str(tmp / "plain.db")
    res = CliRunner().invoke(
        main,
        ["replay", str(pcap), "--db", db, "-q", "--no-redact",
         "--label", f"{port_d}=dense", "--label", f"{port_s}=sparse"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return {"dense": dense, "sparse": sparse, "tmp": tmp, "db": db}


class Truth:
    """What the two models do, computed here with ``generate`` and a forward pass."""

    def __init__(self, dense: Path, sparse: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        torch.set_num_threads(1)  # 2 shared cores: more threads only spin
        self.tok = AutoTokenizer.from_pretrained(dense, local_files_only=True)
        self.models = {
            name: AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
            for name, path in (("dense", dense), ("sparse", sparse))
        }
        self._greedy: dict[tuple[str, tuple[int, ...]], list[int]] = {}

    def prompt(self, text: str) -> list[int]:
        rendered = self.tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(self.tok(rendered, add_special_tokens=False)["input_ids"])

    def greedy(self, name: str, ids: list[int]) -> list[int]:
        got = self._greedy.get((name, tuple(ids)))
        if got is None:
            got = self._greedy[(name, tuple(ids))] = self._generate(name, ids)
        return got

    def _generate(self, name: str, ids: list[int]) -> list[int]:
        """Greedy decoding by full forward passes (no KV cache, unlike the server)."""
        torch = self.torch
        out: list[int] = []
        with torch.inference_mode():
            for _ in range(MAX_TOKENS):
                logits = self.models[name](input_ids=torch.tensor([ids + out]), logits_to_keep=1)
                nxt = int(logits.logits[0, -1].argmax())
                if nxt == self.tok.eos_token_id:
                    break
                out.append(nxt)
        return out

    def logprobs(self, name: str, ids: list[int]) -> Any:
        torch = self.torch
        with torch.inference_mode():
            logits = self.models[name](input_ids=torch.tensor([ids])).logits[0, -1]
        return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.root
@pytest.mark.slow
@needs_torch
@needs_capture
def test_reference_prefers_the_baseline_at_every_fork(recorded: dict[str, Any]) -> None:
    truth = Truth(recorded["dense"], recorded["sparse"])
    res = CliRunner().invoke(
        main,
        ["diff", "--db", recorded["db"], "--baseline", "dense", "--candidate", "sparse",
         "--reference-model", str(recorded["dense"]), "--near-tie-margin", str(MARGIN),
         "--json", "--html", str(recorded["tmp"] / "ref.html")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    assert js["summary"]["pairs"] == len(PROMPTS) * REPEAT
    prompt_of = {p["key"]: p["prompt"].removeprefix("user: ") for p in js["prompts"]}
    forked = 0
    causes: dict[str, str] = {}
    for pair in js["pairs"]:
        text = prompt_of[pair["key"]]
        ctx = truth.prompt(text)
        d, s = truth.greedy("dense", ctx), truth.greedy("sparse", ctx)
        k = next((i for i, (x, y) in enumerate(zip(d, s, strict=False)) if x != y), None)
        if k is None:
            assert pair["identical"] and pair["reference"] is None
            continue
        forked += 1
        ref = pair["reference"]
        assert ref["ids"] == "server" and ref["fork_token"] == k
        assert ref["context_tokens"] == len(ctx)
        assert pair["first_divergence"] == k and pair["token_unit"] == "server"
        # the reference (= the baseline model) prefers the baseline's token
        assert ref["preferred_at_fork"] == "baseline"
        lp_d = truth.logprobs("dense", ctx + d[:k])
        assert ref["baseline_fork_surprisal"] == pytest.approx(-float(lp_d[d[k]]), abs=1e-3)
        assert ref["candidate_fork_surprisal"] == pytest.approx(-float(lp_d[s[k]]), abs=1e-3)
        assert ref["baseline_fork_surprisal"] < ref["candidate_fork_surprisal"]
        # the whole baseline continuation, token by token
        b = ref["baseline"]
        assert len(b["logprobs"]) == len(d) - k
        for i in (0, len(d) - k - 1):
            want = float(truth.logprobs("dense", ctx + d[: k + i])[d[k + i]])
            assert b["logprobs"][i] == pytest.approx(want, abs=1e-3)
        assert b["cumulative_logprob"] == pytest.approx(sum(b["logprobs"]))
        top = sorted(b["highest_surprisal"], key=lambda h: -h["surprisal"])
        assert top[0]["surprisal"] == pytest.approx(-min(b["logprobs"]))
        # the cause, from both models' distributions at the fork
        lp_s = truth.logprobs("sparse", ctx + d[:k])
        views = []
        for lp, mine, other in ((lp_d, d[k], s[k]), (lp_s, s[k], d[k])):
            top_ids = set(lp.topk(TOP).indices.tolist())
            views.append(other in top_ids and abs(float(lp[mine] - lp[other])) <= MARGIN)
        expected = "near_tie" if any(views) else "substantive"
        assert pair["cause"] == expected, (text, pair["cause_evidence"])
        causes[text] = pair["cause"]
    assert forked >= 6, "the pruned copy forks on most prompts (DESIGN.md)"
    assert js["reference"]["preferred_at_fork"]["baseline"] == forked
    assert js["reference"]["scored_pairs"] == forked
    # the HTML report: the surprisal strip under the divergence map
    page = (recorded["tmp"] / "ref.html").read_text(encoding="utf-8")
    assert page.index("Divergence map") < page.index("Reference model") < page.index("Latency")
    assert page.count('aria-label="surprisal strip"') == forked
    assert "<script" not in page
    recorded["causes"] = causes

    # bounded: --max-pairs 1 scores one distinct pair (its repeat shares the result)
    res = CliRunner().invoke(
        main,
        ["diff", "--db", recorded["db"], "--baseline", "dense", "--candidate", "sparse",
         "--reference-model", str(recorded["dense"]), "--max-pairs", "1"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"reference model {recorded['dense']}: 2 of {forked} diverged pairs scored" in res.stdout


@pytest.mark.root
@pytest.mark.slow
@needs_torch
@needs_capture
def test_without_logprobs_the_reference_prefers_the_baseline_at_every_fork(
    recorded_plain: dict[str, Any],
) -> None:
    """No logprobs on the wire: the reference model (the dense model itself) scores
    each fork in its own tokenization of the shared prefix, at the character where
    the texts part, and must prefer the baseline's side at every fork — also where
    re-encoding the whole texts puts the fork elsewhere than where the model
    generated it (a non-canonical token sequence, bytes lost to U+FFFD). The
    servers' logprobs being absent, the reference model decides every cause."""
    truth = Truth(recorded_plain["dense"], recorded_plain["sparse"])
    res = CliRunner().invoke(
        main,
        ["diff", "--db", recorded_plain["db"], "--baseline", "dense", "--candidate", "sparse",
         "--reference-model", str(recorded_plain["dense"]), "--near-tie-margin", str(MARGIN),
         "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    assert js["summary"]["pairs"] == len(PLAIN_PROMPTS)
    prompt_of = {p["key"]: p["prompt"].removeprefix("user: ") for p in js["prompts"]}
    forked = moved = 0
    for pair in js["pairs"]:
        text = prompt_of[pair["key"]]
        ctx = truth.prompt(text)
        d, s = truth.greedy("dense", ctx), truth.greedy("sparse", ctx)
        k = next((i for i, (x, y) in enumerate(zip(d, s, strict=False)) if x != y), None)
        if k is None:
            assert pair["identical"] and pair["reference"] is None
            continue
        forked += 1
        ref = pair["reference"]
        assert ref["ids"] == "retokenized" and ref["fork_scoring"] == "text"
        dt, st = truth.tok.decode(d), truth.tok.decode(s)
        char = next(i for i, (x, y) in enumerate(zip(dt, st, strict=False)) if x != y)
        assert ref["fork_char"] == char == pair["first_divergence_char"]
        # where the model generated the fork token: at or before the fork character,
        # and the scoring starts at or before it (the start of the word holding it)
        generated_at = len(truth.tok.decode(d[:k]))
        assert ref["scored_from_char"] <= generated_at <= char
        retok_d = truth.tok(dt, add_special_tokens=False)["input_ids"]
        retok_s = truth.tok(st, add_special_tokens=False)["input_ids"]
        naive = next(i for i, (x, y) in enumerate(zip(retok_d, retok_s, strict=False)) if x != y)
        moved += naive != k or retok_d[:k] != d[:k]
        # the reference (= the baseline model) prefers the baseline at the fork
        assert ref["preferred_at_fork"] == "baseline", (text, ref)
        fb, fc = ref["baseline_fork_surprisal"], ref["candidate_fork_surprisal"]
        assert 0.0 <= fb < fc
        # the cause: decided by the reference's margin, as no server sent logprobs
        assert pair["cause_source"] == "reference_model", pair
        assert pair["cause"] == ("near_tie" if fc - fb <= MARGIN else "substantive")
        assert pair["cause_evidence"]["server_evidence"] == "no logprobs at the fork"
    assert forked >= 10, "the pruned copy forks on most prompts (DESIGN.md)"
    assert moved >= 1, "some fork sits where re-encoding the texts does not put it"
    assert js["reference"]["preferred_at_fork"]["baseline"] == forked
    assert js["reference"]["causes_decided"] == forked
    assert js["summary"]["causes"]["unknown"] == 0
    assert js["summary"]["cause_sources"]["reference_model"] == forked
    recorded_plain["forked"] = forked


@pytest.mark.root
@pytest.mark.slow
@needs_torch
@needs_capture
def test_stats_explains_the_variants_of_one_label(recorded: dict[str, Any]) -> None:
    """Both servers under one label: repeats of a temperature-0 request give two
    variants, and the second one's cause is the class diff gave the fork."""
    res = CliRunner().invoke(
        main,
        ["stats", "--db", recorded["node_db"], "--json", "--near-tie-margin", str(MARGIN)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    causes = recorded.get("causes")
    if causes is None:
        pytest.skip("runs after test_reference_prefers_the_baseline_at_every_fork")
    seen = 0
    for g in js["groups"]:
        text = g["prompt"].removeprefix("user: ")
        if text not in causes:
            assert g["deterministic"]
            continue
        seen += 1
        first, second = g["variants"]
        assert (first["count"], second["count"]) == (REPEAT, REPEAT)
        assert first["cause"] is None and second["cause"] == causes[text]
    assert seen == len(causes)
    total = sum(js["summary"]["variant_causes"].values())
    assert total == len(causes)


@needs_torch
def test_scoring_without_server_ids_a_stop_at_the_fork_and_a_completion_prompt(
    tiny_models: tuple[Path, Path],
) -> None:
    """Re-tokenized outputs are scored on text, a side that stopped at the fork on
    EOS, a completions prompt with the tokenizer's special tokens — each fork
    checked against a brute-force sum, over every token path that spells the text
    (tokens found by their decoded text, every vocabulary entry tried), of direct
    forward passes."""
    import torch

    from sniffer.llm.reference import ReferenceModel, ScoreJob

    torch.set_num_threads(1)
    dense = tiny_models[0]
    ref = ReferenceModel(str(dense))
    tok, model = ref.tokenizer, ref.model
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}]})
    completion = json.dumps({"prompt": "Once upon a time"})
    jobs = [
        ScoreJob(chat, "The sea is blue", "The sea is green"),
        ScoreJob(chat, "The sea is blue and deep", "The sea is blue", None, None, "length", "stop"),
        ScoreJob(completion, " there was", " there is"),
        ScoreJob(None, "a", "b"),
    ]
    seen: list[tuple[int, int]] = []
    ref.score(jobs, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (6, 6)  # one sequence per side of the three scorable jobs
    assert jobs[3].result == {"error": "the request has no prompt the model can render"}

    special = set(tok.all_special_ids)
    pieces = [
        "" if i in special else str(tok.decode([i])) for i in range(len(tok))
    ]  # every token's text

    def lp_after(ctx: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ctx])).logits[0, -1]
        return [float(x) for x in torch.log_softmax(logits.float(), dim=-1)]

    def brute(
        ctx: list[int], window: str, rests: dict[str, str | None]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Each side's fork surprisal (its likeliest token path through the fork,
        from the likelier of the two sides' paths through the shared window) and
        log P(its text through the fork | the shared window), every path summed."""
        terms: dict[str, list[tuple[float, float]]] = {k: [] for k in rests}  # (joint, path)
        shared: list[float] = []
        texts = [window, *(r for r in rests.values() if r is not None)]
        tails = [window[i:] for i in range(len(window))]
        rel = [  # the tokens that can take part
            (i, p)
            for i, p in enumerate(pieces)
            if p and (any(p in t for t in texts) or any(p.startswith(w) for w in tails))
        ]

        def walk(ids: list[int], done: int, alpha: float) -> None:
            lp = lp_after(ids)
            left = window[done:]
            if not left:
                shared.append(alpha)
            else:
                shared.extend(alpha + lp[i] for i, p in rel
                              if len(p) > len(left) and p.startswith(left))  # fmt: skip
            for side, rest in rests.items():
                if rest is None:  # stopped at the fork: EOS once the window is spelled
                    if not left:
                        terms[side].append((alpha + lp[tok.eos_token_id], alpha))
                    continue
                tail = rest[done:]
                terms[side].extend((alpha + lp[i], alpha) for i, p in rel
                                   if len(p) > len(left) and tail.startswith(p))  # fmt: skip
            for i, p in rel:
                if len(p) <= len(left) and left.startswith(p):
                    walk([*ids, i], done + len(p), alpha + lp[i])

        walk(ctx, 0, 0.0)
        best = {k: max(t) for k, t in terms.items()}
        top = max(path for _, path in best.values())
        surprisal = {k: top - joint for k, (joint, _) in best.items()}
        z = math.log(sum(math.exp(v) for v in shared))
        summed = {k: math.log(sum(math.exp(v) for v, _ in t)) - z for k, t in terms.items()}
        return surprisal, summed

    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    chat_ctx = tok(rendered, add_special_tokens=False)["input_ids"]
    comp_ctx = tok("Once upon a time")["input_ids"]
    # (job, prompt ids, fork character, the start of the word holding it)
    cases = [
        (jobs[0], chat_ctx, len("The sea is "), len("The sea is")),
        (jobs[1], chat_ctx, len("The sea is blue"), len("The sea is")),
        (jobs[2], comp_ctx, len(" there "), len(" there")),
    ]
    for job, ctx, char, start in cases:
        r = job.result
        assert r is not None and r["ids"] == "retokenized" and r["fork_scoring"] == "text"
        assert (r["fork_char"], r["scored_from_char"]) == (char, start)
        prefix = tok(job.baseline_text[:start], add_special_tokens=False)["input_ids"]
        assert r["context_tokens"] == len(ctx) and r["fork_token"] == len(prefix)
        stopped = job.candidate_finish == "stop" and len(job.candidate_text) == char
        want, summed = brute(
            ctx + prefix,
            job.baseline_text[start:char],
            {"baseline": job.baseline_text[start:],
             "candidate": None if stopped else job.candidate_text[start:]},
        )  # fmt: skip
        sb, sc = want["baseline"], want["candidate"]
        assert r["baseline_fork_surprisal"] == pytest.approx(sb, abs=1e-3)
        assert r["candidate_fork_surprisal"] == pytest.approx(sc, abs=1e-3)
        assert r["preferred_at_fork"] == ("baseline" if sb < sc else "candidate")
        for side in ("baseline", "candidate"):
            got = r[side]["fork_text_logprob"]
            assert got == pytest.approx(summed[side], abs=1e-3)
        # the continuation: each side's text from the word's start, in this model's tokens
        b_ids = tok(job.baseline_text[start:], add_special_tokens=False)["input_ids"]
        assert r["baseline"]["scored_tokens"] == len(b_ids)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ctx + prefix + b_ids])).logits[0]
        lps = torch.log_softmax(logits.float(), dim=-1)
        first = len(ctx) + len(prefix)
        want_first = float(lps[first - 1, b_ids[0]])
        assert r["baseline"]["logprobs"][0] == pytest.approx(want_first, abs=1e-3)
    stop = jobs[1].result
    assert stop is not None and stop["candidate"]["stopped_at_fork"] is True
    assert stop["candidate"]["fork_token"] == tok.decode([tok.eos_token_id])
