"""``bench/figures.py``: the figures a ``make bench`` run notes, printed as one
table and written as the Markdown the README's benchmark table is copied from."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import figures


@pytest.fixture
def noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "figures.jsonl"
    monkeypatch.setenv(figures.ENV, str(path))
    figures.note("replay x tshark, one process", "native", 4.14, "x", ">= 3x")
    figures.note("replay x tshark, one process", "pure", 1.4, "x")
    figures.note("replay, one process (wall)", "native", 1.02, "s")
    figures.note("replay, one process (wall)", "tshark", 4.22, "s")
    figures.note("live CPU per chunk event", "native", None, "µs", "<= 10 µs")
    return path


def test_note_writes_nothing_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(figures.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    figures.note("x", "native", 1.0, "s")
    assert list(tmp_path.iterdir()) == []


def test_summary_rows_in_order_with_tshark_column(noted: Path) -> None:
    lines = figures.summary(noted).splitlines()
    assert lines[0].split() == ["figure", "native", "pure", "tshark", "goal"]
    assert lines[1].split()[-5:] == ["4.14x", "1.40x", "-", ">=", "3x"]
    assert "1.020 s" in lines[2] and "4.220 s" in lines[2]
    # a figure that was not measured shows as "-", its goal kept
    assert lines[3].split()[-6:] == ["-", "-", "-", "<=", "10", "µs"]


def test_markdown_is_the_same_rows(noted: Path) -> None:
    md = figures.markdown(noted).splitlines()
    assert md[0] == "| figure | native core | pure core | tshark | goal |"
    assert md[1] == "| --- | --- | --- | --- | --- |"
    assert md[2] == "| replay x tshark, one process | 4.14x | 1.40x | - | ≥ 3x |"
    assert md[3] == "| replay, one process (wall) | 1.020 s | - | 4.220 s |  |"
    assert md[4] == "| live CPU per chunk event | - | - | - | ≤ 10 µs |"


def test_no_tshark_column_when_tshark_was_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.jsonl"
    monkeypatch.setenv(figures.ENV, str(path))
    figures.note("start-up", "native", 0.12, "s", "<= 0.15 s")
    assert figures.markdown(path).splitlines()[0] == "| figure | native core | pure core | goal |"
    assert figures.summary(path).splitlines()[0].split() == ["figure", "native", "pure", "goal"]


def test_empty_run() -> None:
    assert figures.summary(Path("/nonexistent/figures.jsonl")) == "no figures were recorded"
    assert figures.markdown(Path("/nonexistent/figures.jsonl")) == ""
