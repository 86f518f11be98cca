"""Start-up stays lean: commands import only what they use (issue #16).

Not timed (timings belong to bench/bench_startup.py): each case runs the CLI
in a fresh interpreter and checks which heavy libraries ended up in
``sys.modules``. A module-level import of one of them in the wrong place
(``transformers``, ``torch``, ``scapy``, OpenTelemetry, Alembic, ...) fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PCAP = REPO / "pcaps" / "chat_english.pcap"

#: Never needed by these commands.
NEVER = ("transformers", "torch", "scapy", "opentelemetry", "alembic", "google.protobuf")

# The modules are listed by an atexit handler: the console script ends the
# process itself once the command is done (``sniffer.cli.exiting``), after
# running the handlers registered since ``sniffer.cli`` was imported.
RUN = r"""
import atexit, json, sys
argv, out = sys.argv[1:-1], sys.argv[-1]
sys.argv = ["sparseety", *argv]

def dump():
    with open(out, "w") as fh:
        json.dump(sorted(sys.modules), fh)

from sniffer.cli import entry_point
atexit.register(dump)
entry_point()
"""


def loaded(args: list[str], tmp_path: Path, script: str = RUN) -> set[str]:
    """The modules ``script`` (``RUN`` or ``RUN_TO_CAPTURE``) had loaded."""
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.run(
        [sys.executable, "-c", script, *args, str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), proc.stderr
    return set(json.loads(out.read_text()))


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules or any(m.startswith(n + ".") for m in modules))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-stream database at the schema head."""
    d = tmp_path_factory.mktemp("startup")
    path = d / "s.db"
    args = ["replay", "-q", "--no-tokens", str(PCAP), "--db", str(path)]
    subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        cwd=d,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
    )
    return path


@pytest.mark.parametrize("args", [["--help"], ["replay", "--help"], ["run", "--help"]])
def test_help_imports_no_library(args: list[str], tmp_path: Path) -> None:
    mods = loaded(args, tmp_path)
    assert heavy(mods, (*NEVER, "sqlalchemy", "tokenizers", "prometheus_client", "h2")) == []


def test_replay_without_tokens(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "r.db"
    shutil.copy(db, copy)
    mods = loaded(["replay", "-q", "--no-tokens", str(PCAP), "--db", str(copy)], tmp_path)
    assert "sniffer.core.pipeline" in mods  # it did replay
    # No exporter asked for: neither OTLP nor the metrics library; no tokenizer.
    assert heavy(mods, (*NEVER, "tokenizers", "prometheus_client", "sniffer.record.otlp")) == []
    # Nor the token analysis (the collector and the registry do not need it).
    assert heavy(mods, ("sniffer.llm.tokens", "sniffer.llm.registry")) == []
    # A SQLite file at the schema head is written through the stdlib driver.
    assert "sniffer.store.lite" in mods
    assert heavy(mods, ("sqlalchemy",)) == []
    # Other commands' modules stay unloaded (the group loads them when named).
    assert heavy(mods, ("sniffer.cli.run", "sniffer.cli.compare", "sniffer.cli.verify")) == []


def test_replay_with_tokens_at_schema_head(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "r.db"
    shutil.copy(db, copy)
    mods = loaded(["replay", "-q", str(PCAP), "--db", str(copy)], tmp_path)
    assert "tokenizers" in mods  # the token pass ran
    assert heavy(mods, NEVER) == []  # schema at head: no Alembic
    assert heavy(mods, ("sqlalchemy",)) == []  # the token pass writes through the store
    con = sqlite3.connect(copy)
    try:
        assert con.execute("SELECT count(*) FROM stream_tokens").fetchone() == (1,)  # the new one
    finally:
        con.close()


@pytest.mark.parametrize(
    ("command", "reader"),
    [
        (["streams"], "sniffer.store.queries"),
        (["show", "1"], "sniffer.store.queries"),
        (["stats"], "sniffer.reports.stats"),
        (["verify", "--no-tokenize"], "sniffer.reports.verify"),
        (["export"], "sniffer.reports.export"),
        (["export", "--format", "csv"], "sniffer.reports.export"),
        (["diff", "--baseline", "a", "--candidate", "b"], "sniffer.reports.diff"),
        (["top", "--once"], "sniffer.store.live"),
        (["errors"], "sniffer.store.queries"),
    ],
)
def test_sqlite_readers_need_no_sqlalchemy(
    command: list[str], reader: str, db: Path, tmp_path: Path
) -> None:
    """A SQLite file at the schema head is read through the stdlib driver."""
    mods = loaded([*command, "--db", str(db)], tmp_path)
    assert {"sqlite3", "sniffer.store.lite", reader} <= mods  # it did read
    assert heavy(mods, (*NEVER, "sqlalchemy", "prometheus_client", "sniffer.record.otlp")) == []


@pytest.mark.parametrize(
    "command", [["streams"], ["show", "1"], ["stats"], ["verify", "--no-tokenize"], ["errors"]]
)
def test_readers_load_no_pipeline_classes(command: list[str], db: Path, tmp_path: Path) -> None:
    """The reading commands read flags (``sniffer.core.flags``) and open the store
    (``sniffer.store.opening``) without the pipeline's event classes, the
    writer or the capture modules (~20 ms of their start-up)."""
    mods = loaded([*command, "--db", str(db)], tmp_path)
    assert {"sniffer.store.opening", "sniffer.store.queries"} <= mods  # it did read
    assert heavy(mods, ("sniffer.core.events", "sniffer.store.writer", "sniffer.capture")) == []


def test_streams_loads_no_tokenizer(db: Path, tmp_path: Path) -> None:
    mods = loaded(["streams", "--db", str(db)], tmp_path)
    assert heavy(mods, ("tokenizers", "sniffer.llm.tokens")) == []


def test_stats_without_repeats_loads_no_tokenizer(db: Path, tmp_path: Path) -> None:
    """stats encodes only outputs it compares: one stream, nothing to compare."""
    mods = loaded(["stats", "--db", str(db)], tmp_path)
    assert "sniffer.reports.stats" in mods  # it did run
    assert heavy(mods, ("tokenizers", "sniffer.llm.tokens")) == []


def test_verify_of_a_tokenized_file_loads_no_tokenizer(db: Path, tmp_path: Path) -> None:
    """verify reads the token rows the pass stored; it tokenizes (the tokenizer, not
    SQLAlchemy: the token pass runs on the store) only streams that have none."""
    copy = tmp_path / "v.db"
    args = ["replay", "-q", "--no-tokens", str(PCAP), "--db", str(copy)]
    subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
    )
    first = loaded(["verify", "--db", str(copy)], tmp_path)  # no token rows: tokenizes
    assert "tokenizers" in first and heavy(first, ("sqlalchemy",)) == []
    again = loaded(["verify", "--db", str(copy)], tmp_path)
    assert heavy(again, ("tokenizers", "sqlalchemy")) == []


@pytest.mark.parametrize(
    ("command", "writer"),
    [
        (["tokenize", "-q"], "sniffer.record.tokenize_pass"),
        (["tokenize", "-q", "--redo"], "sniffer.record.tokenize_pass"),
        (["prune", "-q", "--older-than", "1s"], "sniffer.store.retention"),
    ],
)
def test_sqlite_writers_need_no_sqlalchemy(
    command: list[str], writer: str, db: Path, tmp_path: Path
) -> None:
    """The token pass and retention run on the store: a SQLite file at the schema
    head through the stdlib driver."""
    copy = tmp_path / "w.db"
    shutil.copy(db, copy)
    mods = loaded([*command, "--db", str(copy)], tmp_path)
    assert {"sqlite3", "sniffer.store.lite", writer} <= mods  # it did run
    assert heavy(mods, (*NEVER, "sqlalchemy", "prometheus_client", "sniffer.record.otlp")) == []


def test_replay_into_a_new_file_needs_no_alembic(tmp_path: Path) -> None:
    """A new SQLite file is created at the schema head with the stdlib driver."""
    mods = loaded(["replay", "-q", "--no-tokens", str(PCAP), "--db", "new.db"], tmp_path)
    assert "sniffer.core.pipeline" in mods and (tmp_path / "new.db").exists()
    assert heavy(mods, (*NEVER, "sqlalchemy", "tokenizers")) == []


def test_run_print_config(tmp_path: Path) -> None:
    mods = loaded(["run", "--print-config"], tmp_path)
    assert heavy(mods, (*NEVER, "sqlalchemy", "tokenizers", "prometheus_client")) == []


#: ``run`` up to its capture opening (no root needed: the probe stops there).
RUN_TO_CAPTURE = r"""
import json, os, sys
argv, out = sys.argv[1:-1], sys.argv[-1]
sys.argv = ["sparseety", *argv]
import sniffer.capture.afpacket as afp

def opened(self):
    with open(out, "w") as fh:
        json.dump(sorted(sys.modules), fh)
    os._exit(0)

afp.AfPacketSource.open = opened
from sniffer.cli import entry_point
entry_point()
"""


def test_run_opens_its_capture_before_the_exporters(tmp_path: Path) -> None:
    """Without OTLP export, sampling or a config file, ``run`` opens its capture
    without the OTLP exporter module, TOML or OpenSSL's hashes (each was a few ms
    of its start-up); the token pass's modules load in its thread later."""
    args = ["run", "--db", str(tmp_path / "r.db"), "--no-metrics"]
    mods = loaded(args, tmp_path, RUN_TO_CAPTURE)
    assert "sniffer.runtime.daemon" in mods  # it got to the capture
    assert "sniffer.record.otlp_setup" in mods  # it did decide on OTLP export
    assert heavy(mods, (*NEVER, "sniffer.record.otlp", "tomllib", "hashlib", "sqlalchemy")) == []
    # The token pass's analysis loads in its thread, the eBPF loader only for
    # the ebpf backend (or an error to match); no ``ldconfig`` child
    # (``ctypes.util.find_library``) for libc.
    assert "sniffer.llm.registry" in mods  # the chain has its tokenizer registry
    late = ("sniffer.llm.tokens", "sniffer.capture.ebpf", "ctypes.util", "subprocess")
    assert heavy(mods, late) == []


#: ``run`` up to its capture opening, printing the collector's thresholds there.
RUN_TO_CAPTURE_GC = r"""
import gc, json, os, sys
argv, out = sys.argv[1:-1], sys.argv[-1]
sys.argv = ["sparseety", *argv]
import sniffer.capture.afpacket as afp

def opened(self):
    with open(out, "w") as fh:
        json.dump(gc.get_threshold(), fh)
    os._exit(0)

afp.AfPacketSource.open = opened
from sniffer.cli import entry_point
entry_point()
"""


def test_run_starts_with_few_collections(tmp_path: Path) -> None:
    """``run`` raises the collector's first threshold from its start (its
    imports make no garbage cycles; at the default the collector ran ~35 times
    before the capture opened), as the daemon's loop has it."""
    from sniffer.cli.common import RECORDING_GC_THRESHOLDS

    out = tmp_path / "gc.json"
    args = ["run", "--db", str(tmp_path / "r.db"), "--no-metrics", str(out)]
    proc = subprocess.run(
        [sys.executable, "-c", RUN_TO_CAPTURE_GC, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), proc.stderr
    assert tuple(json.loads(out.read_text())) == RECORDING_GC_THRESHOLDS != (700, 10, 10)
