"""Real llama.cpp ``llama-server`` traffic (pcaps/llama-server/): what the
server reports about speculative decoding, and how well the cadence
inference (sniffer/reports/cadence.py) agrees with it.

The captures (``scripts/record_llama_server.py``): Gemma 3 270M served plain,
with the same GGUF as its own draft model, and with n-gram lookup
speculation; the openai SDK at temperature 0. llama-server puts ``timings``
(``draft_n``, ``draft_n_accepted``, ``predicted_n`` …) on the last chunk; the
``_tpt`` captures asked for them on every chunk (``timings_per_token``), from
which the recorder wrote each verification step's tokens
(``spec_truth.client_steps``). Everything compared here comes from the
client's record, never from the sniffer.

Two figures are held against each other per stream:

* reported tokens per step = ``predicted_n / (predicted_n − draft_n_accepted)``:
  every decoding step of llama-server emits its sampled token plus the draft
  tokens it accepted, so the steps are the tokens less the accepted drafts;
* the cadence's estimate = tokens / bursts (``Cadence.tokens_per_step``).

The test prints the figures (``pytest -s``); it asserts what does not hang on
this machine's timing noise: the plain server is never called bursty, a
stream whose steps average two tokens or more is, and the estimate rises with
the reported figure (rank correlation above zero).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import pytest

from sniffer.reports.cadence import BURSTY, STEADY, UNKNOWN, Cadence, cadence, summarize
from sniffer.reports.stats import Output, load_outputs
from sniffer.runtime.replay import replay
from sniffer.store.writer import open_store

DIR = Path(__file__).resolve().parent.parent / "pcaps" / "llama-server"
CAPS = sorted(DIR.glob("llama_server_*.pcap"))
STEMS = [p.stem for p in CAPS]


def _expected(stem: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DIR / f"{stem}.expected.json").read_text())
    return data


class Stream:
    """One recorded stream: the client's record, the stored row, the output."""

    def __init__(self, want: dict[str, Any], row: dict[str, Any], out: Output) -> None:
        self.want = want
        self.row = row
        self.out = out

    @property
    def timings(self) -> dict[str, Any]:
        t: dict[str, Any] = self.want["timings"] or {}
        return t

    @property
    def reported_per_step(self) -> float | None:
        """Tokens per decoding step from the client's last ``timings``."""
        n, acc = self.timings.get("predicted_n"), self.timings.get("draft_n_accepted", 0)
        if not n or n - acc <= 0:
            return None
        return float(n / (n - acc))

    @property
    def cadence(self) -> Cadence:
        assert self.out.cadence is not None
        return self.out.cadence


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Stream]]:
    """Each capture replayed into its own SQLite file; its streams matched to
    the expected entries by client port (one connection per stream)."""
    root = tmp_path_factory.mktemp("llama-server")
    out: dict[str, list[Stream]] = {}
    for pcap in CAPS:
        db = root / f"{pcap.stem}.db"
        replay(pcap, str(db))
        outputs = {o.stream_id: o for o in load_outputs(open_store(str(db)))}
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        rows = {
            int(r["client"].rsplit(":", 1)[1]): dict(r)
            for r in con.execute("SELECT * FROM streams").fetchall()
        }
        con.close()
        streams = []
        for want in _expected(pcap.stem)["streams"]:
            row = rows[want["client_port"]]
            streams.append(Stream(want, row, outputs[row["id"]]))
        out[pcap.stem] = streams
    return out


def test_the_captures_are_there() -> None:
    assert set(STEMS) == {
        "llama_server_plain",
        "llama_server_draft",
        "llama_server_draft_tpt",
        "llama_server_ngram",
        "llama_server_ngram_tpt",
    }
    for stem in STEMS:
        exp = _expected(stem)
        assert exp["server"]["software"] == "llama.cpp llama-server"
        assert all(s["state"] == "complete" for s in exp["streams"])
        assert all(s["choices"]["0"]["chunks"] <= 128 for s in exp["streams"])


@pytest.mark.parametrize("stem", STEMS)
def test_stored_spec_figures_are_the_clients(stem: str, recorded: dict[str, list[Stream]]) -> None:
    """Per stream, the stored draft_n, draft_n_accepted, acceptance rate and
    predicted_n are those of the last ``timings`` the client received."""
    speculative = _expected(stem)["server"]["speculative"]
    for s in recorded[stem]:
        t, row = s.timings, s.row
        assert row["server_predicted_n"] == t["predicted_n"]
        assert row["server_prompt_n"] == t["prompt_n"]
        if "draft_n" in t:
            assert speculative
            assert row["spec_source"] == "llama.cpp"
            assert row["spec_draft_tokens"] == t["draft_n"]
            assert row["spec_accepted_tokens"] == t["draft_n_accepted"]
            assert row["spec_accept_rate"] == pytest.approx(t["draft_n_accepted"] / t["draft_n"])
            assert s.out.speculative is not None
            assert s.out.speculative.accepted_tokens == t["draft_n_accepted"]
        else:  # llama-server omits the draft figures when it drafted nothing
            assert row["spec_source"] is None and s.out.speculative is None


def test_client_steps_add_up(recorded: dict[str, list[Stream]]) -> None:
    """The recorder's per-step truth is consistent with the last timings:
    the steps' tokens are the stream's chunks, their accepted drafts (each
    step's tokens less one) the server's ``draft_n_accepted``."""
    for stem in ("llama_server_draft_tpt", "llama_server_ngram_tpt"):
        for s in recorded[stem]:
            steps = s.want["spec_truth"]["client_steps"]
            assert sum(steps) == s.want["choices"]["0"]["chunks"]
            assert sum(n - 1 for n in steps) == s.timings.get("draft_n_accepted", 0)


def test_the_plain_server_is_never_bursty(recorded: dict[str, list[Stream]]) -> None:
    classes = [s.cadence.cls for s in recorded["llama_server_plain"]]
    print("plain:", classes)
    assert BURSTY not in classes
    assert classes.count(STEADY) >= len(classes) - 1


def _spec_streams(recorded: dict[str, list[Stream]]) -> list[tuple[str, Stream]]:
    return [
        (stem, s)
        for stem in STEMS
        if _expected(stem)["server"]["speculative"]
        for s in recorded[stem]
    ]


def test_high_acceptance_streams_are_bursty(recorded: dict[str, list[Stream]]) -> None:
    """A speculative stream whose steps average two tokens or more (half its
    tokens were accepted drafts) is classed bursty."""
    high = [
        (stem, s)
        for stem, s in _spec_streams(recorded)
        if (s.reported_per_step or 0) >= 2.0 and s.cadence.cls != UNKNOWN
    ]
    assert high, "no speculative stream with two tokens or more per step"
    for stem, s in high:
        assert s.cadence.cls == BURSTY, (stem, s.reported_per_step, s.cadence.describe())


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def _pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else 0.0


def test_cadence_estimate_against_reported_tokens_per_step(
    recorded: dict[str, list[Stream]],
) -> None:
    """The measurement: per speculative stream, the reported tokens per step
    and the cadence's estimate; their errors and rank correlation."""
    rows = []
    for stem, s in _spec_streams(recorded):
        rep = s.reported_per_step
        est = s.cadence.tokens_per_step
        if rep is None or est is None or s.cadence.cls == UNKNOWN:
            continue
        rows.append((stem, rep, est, s))
    print()
    print(f"{'capture':26s} {'acc':>9s} {'rate':>5s} {'rep':>5s} {'est':>5s} class")
    for stem, rep, est, s in rows:
        t = s.timings
        rate = t.get("draft_n_accepted", 0) / t["draft_n"] if t.get("draft_n") else 0.0
        acc = f"{t.get('draft_n_accepted', 0)}/{t.get('draft_n', 0)}"
        print(f"{stem:26s} {acc:>9s} {rate:5.2f} {rep:5.2f} {est:5.2f} {s.cadence.cls}")
    reps = [r for _, r, _, _ in rows]
    ests = [e for _, _, e, _ in rows]
    errors = [e - r for r, e in zip(reps, ests, strict=True)]
    rho = _pearson(_ranks(reps), _ranks(ests))
    print(
        f"streams {len(rows)}: mean error {statistics.fmean(errors):+.2f}, mean |error| "
        f"{statistics.fmean(abs(e) for e in errors):.2f}, mean |error|/reported "
        f"{statistics.fmean(abs(e) / r for e, r in zip(errors, reps, strict=True)):.2f}, "
        f"Pearson {_pearson(reps, ests):.2f}, Spearman {rho:.2f}"
    )
    summary = summarize((s.cadence, s.out.speculative) for _, _, _, s in rows)
    print("summary:", summary["bursty_ratio"], summary["spec_acceptance_rate"])
    assert len(rows) >= 6
    assert rho > 0
    # the reports derive llama.cpp's tokens per step from the stored figures
    # (predicted_n − accepted steps): what the client's timings give, and the
    # summary's estimate_vs_reported is the comparison printed above
    drafted = []
    for _, rep, est, s in rows:
        sd = s.out.speculative
        if sd is not None and sd.accept_length is not None:
            assert sd.accept_length == pytest.approx(rep)
            drafted.append((est, rep))
    evr = summary["estimate_vs_reported"]
    assert evr["outputs"] == len(drafted) > 0
    assert evr["mean_error"] == pytest.approx(statistics.fmean(e - r for e, r in drafted))


def _boundaries(times: tuple[float, ...], c: Cadence) -> set[int]:
    """Chunk indexes that start a burst (the first chunk excluded)."""
    if c.cls != BURSTY or c.threshold_ms is None:
        return set(range(1, len(times)))
    t = c.threshold_ms / 1000.0
    return {i for i in range(1, len(times)) if times[i] - times[i - 1] > t}


def test_bursts_against_the_clients_steps(recorded: dict[str, list[Stream]]) -> None:
    """With per-token timings the client knows where each verification step
    starts: the cadence's burst starts are held to them (precision: a burst
    start that is a step start; recall: a step start found)."""
    tp = fp = fn = 0
    print()
    for stem in ("llama_server_draft_tpt", "llama_server_ngram_tpt"):
        for s in recorded[stem]:
            steps = s.want["spec_truth"]["client_steps"]
            truth: set[int] = set()
            pos = 0
            for n in steps[:-1]:
                pos += n
                truth.add(pos)
            times = s.out.chunk_times
            assert len(times) == sum(steps)
            c = cadence(times)
            got = _boundaries(times, c)
            tp += len(got & truth)
            fp += len(got - truth)
            fn += len(truth - got)
            print(
                f"{stem:24s} steps {len(steps):3d} bursts {c.bursts:3d} {c.cls:7s} "
                f"hit {len(got & truth):3d} extra {len(got - truth):3d} missed "
                f"{len(truth - got):3d}"
            )
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    print(f"step starts: precision {precision:.2f} recall {recall:.2f}")
    # a step start follows a draft and a verification (tens of ms or more), the
    # gaps inside a step are writes back to back: the starts are found
    assert recall >= 0.9
