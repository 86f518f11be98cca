"""The command line, as a user runs it: ``replay``, ``streams``, ``show``,
``export``, ``errors`` and ``prune`` through click on real replayed SQLite
files (bundled captures, real tokenizer), asserting what they print and write.

(``run``, ``verify``, ``tokenize``, ``probe``, ``stats`` and ``diff`` have their
CLI tests beside their modules: test_config, test_live_e2e, test_verify,
test_probe, test_stats_diff.)
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sniffer.cli import main

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
PEER = ROOT / "tests" / "data" / "peer-pcaps" / "zeek-http"
TRUNCATED = PCAPS / "faults" / "fault_truncated_file.pcap"
TABLES = ("streams", "chunks", "connections", "stream_tokens", "choice_tokens")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def expected(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PCAPS / f"{name}.expected.json").read_text())
    return data


def text_of(name: str, i: int = 0) -> str:
    text: str = expected(name)["streams"][i]["choices"]["0"]["text"]
    return text


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    """chat_english (stream 1), keepalive_3, error_midstream, reasoning_tools,
    labelled by server port like a user would (each replay takes its own id
    block: look ids up with :func:`ids`)."""
    db = str(tmp_path_factory.mktemp("cli") / "demo.db")
    for name in ("chat_english", "keepalive_3", "error_midstream", "reasoning_tools"):
        port = expected(name)["server_port"]
        res = cli(
            "replay", str(PCAPS / f"{name}.pcap"), "--db", db, "-q", "--label", f"{port}={name}"
        )
        assert res.exit_code == 0, res.output
    return db


def ids(db: str, label: str) -> list[int]:
    """Stream ids of one label, in capture order."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id FROM streams WHERE label = ? ORDER BY id", (label,))
        return [r[0] for r in rows]


# ----------------------------------------------------------------- replay


def test_replay_prints_a_summary_per_file(tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")
    res = cli("replay", str(PCAPS / "keepalive_3.pcap"), str(PCAPS / "n2.pcap"), "--db", db, "-q")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    head = [ln for ln in lines if ln.startswith(str(PCAPS))]
    assert head[0].startswith(f"{PCAPS / 'keepalive_3.pcap'}: ")
    assert "3 streams (complete 3)" in head[0] and ", 0 errors" in head[0]
    assert "1 streams (complete 1)" in head[1]
    assert any(ln.strip().startswith("tokens: ") and "in 3 streams" in ln for ln in lines)
    assert f"→ {db}" in res.output


def test_replay_json_summary(tmp_path: Path) -> None:
    res = cli("replay", str(PCAPS / "n2.pcap"), "--db", str(tmp_path / "j.db"), "-q", "--json")
    assert res.exit_code == 0
    s = json.loads(res.output)
    assert s["file"].endswith("n2.pcap") and s["streams"] == 1 and s["states"] == {"complete": 1}
    assert s["capture_error"] is None and s["tokens"] > 0 and s["packets"] > 0


def test_replay_csv_summary_is_one_line_per_file_with_the_json_keys(tmp_path: Path) -> None:
    files = [str(PCAPS / "n2.pcap"), str(TRUNCATED)]
    db = str(tmp_path / "c.db")
    res = cli("replay", *files, "--db", db, "-q", "--no-tokens", "--csv")
    assert res.exit_code == 1  # the truncated file, as without --csv
    rows = list(csv.DictReader(io.StringIO(res.output)))
    as_json = cli("replay", *files, "--db", str(tmp_path / "j.db"), "-q", "--no-tokens", "--json")
    want = json.loads(as_json.output)
    assert [r["file"] for r in rows] == files and list(rows[0]) == list(want[0])
    assert [int(r["streams"]) for r in rows] == [w["streams"] for w in want]
    assert [json.loads(r["states"]) for r in rows] == [w["states"] for w in want]
    assert rows[0]["capture_error"] == "" and rows[1]["capture_error"] == want[1]["capture_error"]
    both = CliRunner().invoke(main, ["replay", files[0], "--db", db, "--json", "--csv"])
    assert both.exit_code == 2 and "--json and --csv cannot be combined" in both.output


def test_replay_reports_the_tcp_reassembly_counters(tmp_path: Path) -> None:
    """``--json`` carries the reassembler's counters by kind (the fixture's
    expected counts come from the segments its script put on the wire); the
    text summary names those that are not zero."""
    fixture = PCAPS / "faults" / "fault_overlap_mismatch.pcap"
    want = json.loads(fixture.with_suffix(".expected.json").read_text())["reassembly"]
    res = cli("replay", str(fixture), "--db", str(tmp_path / "t.db"), "-q", "--json", "--no-tokens")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["reassembly"]
    assert {k: got[k] for k in want} == want and got["overlap-mismatch"] == 2
    assert got["lost-bytes"] == 0 and got["buffer-cap"] == 0
    text = cli("replay", str(fixture), "--db", str(tmp_path / "u.db"), "-q", "--no-tokens")
    assert "  tcp reassembly: retransmission 5, overlap-mismatch 2, out-of-order 2" in text.output


def test_streams_do_not_show_a_negative_ttft_as_real(tmp_path: Path) -> None:
    """A stream flagged clock-backwards (its response captured 2 s before its
    request) shows "(clock)" for TTFT and duration, and a note says why."""
    db = str(tmp_path / "c.db")
    fixture = PCAPS / "faults" / "fault_clock_backwards.pcap"
    assert cli("replay", str(fixture), "--db", db, "-q", "--no-tokens").exit_code == 0
    res = cli("streams", "--db", db)
    assert res.exit_code == 0
    lines = res.output.splitlines()
    rows = [ln for ln in lines[1:] if "/v1/chat/completions" in ln]
    assert len(rows) == 3 and sum("(clock)  (clock)" in ln for ln in rows) == 1
    assert not re.search(r" -\d", res.output)  # no negative figure anywhere
    assert "1 stream(s) flagged clock-backwards" in res.output
    shown = cli("show", "1", "--db", db)
    assert "flags: clock-backwards (the capture clock went backwards" in shown.output


def test_replay_of_a_truncated_file_stores_what_it_could_and_exits_1(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    res = cli("replay", str(TRUNCATED), "--db", db, "-q", "--no-tokens")
    assert res.exit_code == 1
    assert "capture error: truncated packet record at offset" in res.output
    assert "(everything before it was stored)" in res.output
    listed = cli("streams", "--db", db)
    assert listed.exit_code == 0 and len(listed.output.splitlines()) == 1 + 3


def test_replay_usage_and_input_errors(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    missing = cli("replay", str(tmp_path / "nope.pcap"), "--db", db)
    assert missing.exit_code == 2 and "nope.pcap: no such file" in missing.output
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture file at all")
    bad = cli("replay", str(junk), "--db", db)
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1
    assert "junk.pcap" in bad.output
    label = cli("replay", str(PCAPS / "n2.pcap"), "--db", db, "--label", "oops")
    assert label.exit_code == 2


# ---------------------------------------------------------------- streams


def test_streams_lists_one_line_per_llm_stream(demo: str) -> None:
    res = cli("streams", "--db", demo)
    assert res.exit_code == 0
    header, *rows = res.output.splitlines()
    assert header.split() == [
        "id",
        "label",
        "state",
        "model",
        "path",
        "st",
        "chunks",
        "chars",
        "ttft_ms",
        "dur_ms",
        "spec",
        "finish",
    ]
    assert len(rows) == 7
    first = rows[0].split()
    english = expected("chat_english")["streams"][0]
    assert first[:6] == [
        "1",
        "chat_engl",
        "complete",
        english["model"],
        "/v1/chat/completions",
        "200",
    ]
    assert int(first[6]) == english["choices"]["0"]["chunks"]
    assert int(first[7]) == len(english["choices"]["0"]["text"])
    assert float(first[8]) == pytest.approx(english["ttft_ms"], abs=0.051)
    assert first[10] == "-"  # no speculative decoding reported
    assert first[11] == english["choices"]["0"]["finish_reason"]
    states = [r.split()[2] for r in rows]
    assert states.count("error") == 1 and states.count("complete") == 6


def test_streams_filters_and_json(demo: str) -> None:
    only = cli("streams", "--db", demo, "--state", "error")
    assert only.exit_code == 0
    rows = only.output.splitlines()[1:]
    assert len(rows) == 1 and rows[0].split()[1] == "error_mid"
    lines = cli("streams", "--db", demo, "--json", "--label", "keepalive_3").output.splitlines()
    got = [json.loads(ln) for ln in lines]
    assert [r["exchange"] for r in got] == [0, 1, 2]
    assert {r["label"] for r in got} == {"keepalive_3"}
    assert [bool(r["is_stream"]) for r in got] == [
        s["stream"] for s in expected("keepalive_3")["streams"]
    ]
    assert len(cli("streams", "--db", demo, "--limit", "2").output.splitlines()) == 3
    model = expected("reasoning_tools")["streams"][1]["model"]
    by_model = cli("streams", "--db", demo, "--model", model, "--json").output.splitlines()
    assert [json.loads(ln)["model"] for ln in by_model] == [model]
    none = cli("streams", "--db", demo, "--label", "nobody")
    assert none.exit_code == 0 and none.output.startswith("no streams (try --all")


def test_streams_csv_and_columns_carry_the_json_rows(demo: str) -> None:
    """``--csv`` has the keys of ``--json`` as its header and one line per row;
    ``--column`` keeps those keys, in that order, in either."""
    rows = [json.loads(ln) for ln in cli("streams", "--db", demo, "--json").output.splitlines()]
    table = list(csv.reader(io.StringIO(cli("streams", "--db", demo, "--csv").output)))
    assert table[0] == list(rows[0]) and len(table) == len(rows) + 1
    assert [int(r[0]) for r in table[1:]] == [r["id"] for r in rows]
    picked = cli("streams", "--db", demo, "--csv", "-c", "state", "--column", "id").output
    assert picked.splitlines() == ["state,id", *(f"{r['state']},{r['id']}" for r in rows)]
    got = cli("streams", "--db", demo, "--json", "-c", "id", "-c", "model").output.splitlines()
    assert [json.loads(ln) for ln in got] == [{"id": r["id"], "model": r["model"]} for r in rows]


def test_output_options_reject_what_cannot_be_printed(demo: str) -> None:
    for args, message in (
        (("--json", "--csv"), "--json and --csv cannot be combined"),
        (("-c", "id"), "--column needs --json or --csv"),
        (("--csv", "-c", "nope"), "no column 'nope' (columns: id, "),
    ):
        res = CliRunner().invoke(main, ["streams", "--db", demo, *args])
        assert res.exit_code == 2 and message in res.output, res.output


def test_nodes_as_table_json_and_csv(demo: str) -> None:
    rows = [json.loads(ln) for ln in cli("nodes", "--db", demo, "--json").output.splitlines()]
    assert len(rows) == 1 and rows[0]["streams"] == len(
        cli("streams", "--db", demo, "--json").output.splitlines()
    )
    table = cli("nodes", "--db", demo).output.splitlines()
    assert table[0].split()[:2] == ["node", "streams"] and table[1].split()[0] == rows[0]["node"]
    assert list(csv.DictReader(io.StringIO(cli("nodes", "--db", demo, "--csv").output))) == [
        {k: str(v) for k, v in rows[0].items()}
    ]


def test_streams_all_shows_plain_http_exchanges(tmp_path: Path) -> None:
    db = str(tmp_path / "http.db")
    assert cli("replay", str(PEER / "get.pcap"), "--db", db, "-q", "--no-tokens").exit_code == 0
    assert cli("streams", "--db", db).output.startswith("no streams")
    rows = cli("streams", "--db", db, "--all").output.splitlines()[1:]
    assert len(rows) == 1 and rows[0].split()[2:6] == [
        "complete",
        "-",
        "/download/CHANGES.bro-",  # paths are cut to 22 characters
        "200",
    ]


# ------------------------------------------------------------------- show


def test_show_prints_the_request_and_every_chunk(demo: str) -> None:
    res = cli("show", "1", "--db", demo)
    assert res.exit_code == 0
    lines = res.output.splitlines()
    english = expected("chat_english")
    want = english["streams"][0]
    assert lines[0].startswith(f"stream 1  127.0.0.1:{want['client_port']} → ")
    assert "POST /v1/chat/completions  label=chat_english" in lines[0]
    assert f"model={want['model']} stream=True" in lines[1] and "dialect=openai.chat" in lines[1]
    assert "state=complete (complete) done=True gap=False" in lines[2]
    assert lines[3].strip().startswith("request at ")
    n = want["choices"]["0"]["chunks"]
    assert lines[4].strip().startswith(f"{n} text chunks, {want['sse_events']} events")
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["seq", "+ms"])
    chunk_lines = lines[header + 1 :]
    assert len(chunk_lines) == want["sse_events"]
    texts = [json.loads(ln.split(None, 5)[5].split(" [")[0]) for ln in chunk_lines]
    assert "".join(texts) == want["choices"]["0"]["text"]
    assert "[finish=" + want["choices"]["0"]["finish_reason"] + "]" in res.output


def test_show_tool_calls_and_errors(demo: str) -> None:
    tools = cli("show", str(ids(demo, "reasoning_tools")[1]), "--db", demo).output
    call = expected("reasoning_tools")["streams"][1]["choices"]["0"]["tool_calls"][0]
    assert call["id"] in tools and call["name"] in tools and "reasoning" in tools
    err = cli("show", str(ids(demo, "error_midstream")[0]), "--db", demo).output
    message = expected("error_midstream")["streams"][0]["error"]["message"]
    assert f"  error: {message}" in err.splitlines()


def test_show_json_and_missing_stream(demo: str) -> None:
    s = json.loads(cli("show", "1", "--db", demo, "--json").output)
    assert s["id"] == 1 and s["state"] == "complete"
    assert "".join(c["text"] or "" for c in s["chunks"]) == text_of("chat_english")
    missing = cli("show", "999", "--db", demo)
    assert missing.exit_code == 1 and "no stream 999" in missing.output


# ----------------------------------------------------------------- export


def test_export_jsonl_is_the_event_log(demo: str) -> None:
    res = cli("export", "--db", demo, "--format", "jsonl", "--stream", "1")
    assert res.exit_code == 0
    records = [json.loads(ln) for ln in res.output.splitlines()]
    kinds = [r["event"] for r in records]
    want = expected("chat_english")["streams"][0]["choices"]["0"]
    assert kinds == ["request_start"] + ["chunk"] * want["chunks"] + ["stream_done"]
    chunks = [r for r in records if r["event"] == "chunk"]
    assert "".join(r["delta_text"] for r in chunks) == want["text"]
    assert chunks[-1]["accumulated_len"] == len(want["text"])
    done = records[-1]
    assert done["complete"] is True and done["gap"] is False
    assert done["chunk_count"] == want["chunks"] and done["total_text_len"] == len(want["text"])
    assert records[0]["model"] == expected("chat_english")["streams"][0]["model"]


def test_export_to_a_file_filtered_by_label(demo: str, tmp_path: Path) -> None:
    out = tmp_path / "ka.jsonl"
    res = cli("export", "--db", demo, "--label", "keepalive_3", "-o", str(out))
    assert res.exit_code == 0
    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert f"wrote {len(records)} records to {out}" in res.output
    starts = [r["stream_id"] for r in records if r["event"] == "request_start"]
    assert starts == ids(demo, "keepalive_3") and len(starts) == 3


def test_export_csv_one_row_per_stream(demo: str) -> None:
    res = cli("export", "--db", demo, "--format", "csv")
    assert res.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert len(rows) == 7
    assert rows[0]["state"] == "complete"
    assert [r["state"] for r in rows].count("error") == 1


# ----------------------------------------------------------------- errors


def test_errors_lists_recorded_bad_input(tmp_path: Path) -> None:
    db = str(tmp_path / "err.db")
    assert cli("replay", str(PCAPS / "n2.pcap"), "--db", db, "-q", "--no-tokens").exit_code == 0
    assert cli("errors", "--db", db).output == "no errors\n"
    cli("replay", str(TRUNCATED), "--db", db, "-q", "--no-tokens")
    for name in ("http-11-request-then-cruft.pcap", "http_09.pcap"):
        assert cli("replay", str(PEER / name), "--db", db, "-q", "--no-tokens").exit_code == 0
    res = cli("errors", "--db", db)
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert any(" capture/file " in ln and "truncated packet record at offset" in ln for ln in lines)
    # the captures' non-HTTP bytes and answers to them: recorded, with their connection
    assert any(" http/not-http conn=" in ln for ln in lines)
    assert any(" http/desync conn=" in ln and "response without a request" in ln for ln in lines)
    assert all(": " in ln and " conn=" in ln and " stream=" in ln for ln in lines)
    assert len(cli("errors", "--db", db, "--limit", "1").output.splitlines()) == 1
    # the same rows through the shared output options
    rows = [json.loads(ln) for ln in cli("errors", "--db", db, "--json").output.splitlines()]
    assert len(rows) == len(lines) and {"stage", "kind", "message"} <= set(rows[0])
    assert any(r["stage"] == "http" and r["kind"] == "desync" for r in rows)
    picked = cli("errors", "--db", db, "--csv", "-c", "stage", "-c", "kind").output
    assert picked.splitlines() == ["stage,kind", *(f"{r['stage']},{r['kind']}" for r in rows)]


# ------------------------------------------------------------------ prune


def test_prune_deletes_old_streams_with_their_rows(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    assert cli("replay", str(PCAPS / "keepalive_3.pcap"), "--db", db, "-q").exit_code == 0
    with sqlite3.connect(db) as con:
        (chunks,) = con.execute("SELECT count(*) FROM chunks").fetchone()
    assert chunks > 3
    # The capture's streams are years younger than 100 years: nothing goes.
    keep = cli("prune", "--db", db, "--older-than", "5200w")
    assert keep.exit_code == 0
    assert keep.output.startswith("deleted 0 streams, 0 chunks, 0 errors, 0 connections")
    assert len(cli("streams", "--db", db).output.splitlines()) == 4
    # Everything captured is older than a second: all of it goes, in batches of 1.
    gone = cli("prune", "--db", db, "--older-than", "1s", "--batch", "1")
    assert gone.exit_code == 0
    first = gone.output.splitlines()[0]
    assert first.startswith(f"deleted 3 streams, {chunks} chunks, 0 errors, 1 connections in ")
    assert cli("streams", "--db", db, "--all").output.startswith("no streams")
    with sqlite3.connect(db) as con:
        left = [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES]
    assert left == [0] * len(TABLES)
    assert cli("export", "--db", db).output == ""


def test_prune_rejects_a_bad_age(tmp_path: Path) -> None:
    res = cli("prune", "--db", str(tmp_path / "x.db"), "--older-than", "soon")
    assert res.exit_code == 2 and "--older-than" in res.output


def test_the_console_script_keeps_exit_codes_and_flushes_all_output(
    demo: str, tmp_path: Path
) -> None:
    """``python -m sniffer.cli`` ends its process itself once a command is done
    (``_exit_quickly``, no interpreter teardown): every byte written to a pipe
    still arrives, and the exit codes stay what click and the commands say."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "sniffer.cli", *args],
            capture_output=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )

    piped = run("export", "--db", demo)
    assert piped.returncode == 0, piped.stderr
    out = tmp_path / "export.jsonl"
    assert run("export", "--db", demo, "-o", str(out)).returncode == 0
    assert piped.stdout == out.read_bytes()
    assert len(piped.stdout) > 10_000  # more than one buffer's worth went through the pipe

    assert run("no-such-command").returncode == 2  # click's usage error
    # the connections a command left open are closed as the teardown would have:
    # the last one checkpoints the WAL, and the database is one file again
    db = tmp_path / "w.db"
    chat = str(PCAPS / "chat_english.pcap")
    assert run("replay", chat, "--db", str(db), "-q", "--no-tokens").returncode == 0
    for command in ("verify", "stats", "streams"):
        assert run(command, "--db", str(db)).returncode == 0, command
        assert sorted(p.name for p in tmp_path.glob("w.db*")) == ["w.db"], command
    # under a profiler the process exits the normal way: the profile gets written
    prof = tmp_path / "cli.prof"
    profiled = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "sniffer.cli", "--help"],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert profiled.returncode == 0 and prof.stat().st_size > 0
    bad = run("replay", str(TRUNCATED), "--db", str(tmp_path / "t.db"), "-q")
    assert bad.returncode == 1  # the command's own code (a truncated capture)
    assert b"truncated" in bad.stdout + bad.stderr


def test_replay_redact_pattern_replaces_what_the_regex_matches(tmp_path: Path) -> None:
    """``--redact-pattern NAME=REGEX``: the text the regex matches is stored as
    ``<NAME>`` (the chain once handed the pair to the redactor the other way
    round, so the name was searched for and the regex became the placeholder)."""
    db = str(tmp_path / "r.db")
    res = cli(
        "replay", str(PCAPS / "chat_english.pcap"), "--db", db, "-q", "--no-tokens",
        "--redact-pattern", r"BIRD=[Bb]ird",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    captured = text_of("chat_english")
    assert "Bird" in captured and "<BIRD>" not in captured
    with sqlite3.connect(db) as conn:
        stored = "".join(
            t for (t,) in conn.execute("SELECT text FROM chunks WHERE text IS NOT NULL ORDER BY id")
        )
    assert "<BIRD>" in stored
    assert "Bird" not in stored and "bird" not in stored
    assert stored.replace("<BIRD>", "") == re.sub("[Bb]ird", "", captured)


def test_streams_and_show_print_server_reported_speculative_decoding(tmp_path: Path) -> None:
    """The crafted vLLM fixture: ``streams`` shows the accepted share of the
    drafted tokens, ``show`` the reported figures and the cadence line."""
    db = str(tmp_path / "spec.db")
    assert cli("replay", str(PCAPS / "dialect_spec_vllm.pcap"), "--db", db, "-q").exit_code == 0
    res = cli("streams", "--db", db)
    assert res.exit_code == 0
    rows = [r.split() for r in res.output.splitlines()[1:]]
    # 5 of 9 drafted tokens accepted; then 8 of 12 (what the crafting script sent)
    assert [r[10] for r in rows] == ["56%", "67%"]
    shown = cli("show", rows[0][0], "--db", db)
    assert shown.exit_code == 0
    assert (
        "speculative decoding reported by vllm: 5 of 9 drafted tokens accepted (55.6%), "
        "3 steps, mean accepted length 2.67, histogram [0, 1, 2, 0]" in shown.output
    )
    assert "cadence (choice 0): unknown (2 gaps" in shown.output
