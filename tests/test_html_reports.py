"""The HTML reports of ``diff --html`` and ``stats --html``, looked at in a real
browser: Debian's ``chromium``, headless.

The store: fixture captures replayed twice, once under each of two labels
(``dense`` and ``sparse``), so every request is seen on both sides. Each
report must be self-contained (no script, no network or file asset), carry
the TTFT and inter-token latency plots with their axes and units, render in
Chromium without a console message (a page that logs an error is caught by
the same check), and its screenshot must show the bars in each label's
colour. The screenshots are written to ``$SPARSEETY_SCREENSHOTS`` when set
(the README's come from there), else to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
CAPTURES = {"concurrent_4": 18124, "keepalive_3": 18441, "chat_english": 18036}
LABELS = ("dense", "sparse")
# the colours of the two labels' bars (sniffer.reports.html BASE_COLOUR, CAND_COLOUR)
COLOURS = {"dense": (0x3B, 0x6F, 0xB6), "sparse": (0xD9, 0x82, 0x2B)}

needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian's chromium is not installed"
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("html")
    db = str(tmp / "two-labels.db")
    for name, port in CAPTURES.items():
        for label in LABELS:
            r = cli("replay", str(PCAPS / f"{name}.pcap"), "--db", db, "--label",
                    f"{port}={label}", "-q")  # fmt: skip
            assert r.returncode == 0, r.stderr
    out = {"stats": tmp / "stats.html", "diff": tmp / "diff.html"}
    r = cli("stats", "--db", db, "--html", str(out["stats"]))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out['stats']}" in r.stderr
    r = cli("diff", "--db", db, "--baseline", "dense", "--candidate", "sparse",
            "--html", str(out["diff"]))  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def screenshot_dir(tmp_path: Path) -> Path:
    d = os.environ.get("SPARSEETY_SCREENSHOTS")
    path = Path(d) if d else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


#: window heights that hold the whole page (the diff's summary table is long)
HEIGHTS = {"stats": 1700, "diff": 4300}


def chromium(page: Path, png: Path, profile: Path, height: int) -> list[str]:
    """Render ``page`` headless into ``png`` (a fresh browser profile in
    ``profile``); the console messages it logged."""
    r = subprocess.run(
        [
            "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", f"--window-size=1200,{height}",
            f"--screenshot={png}", page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert png.exists() and png.stat().st_size > 1000, r.stderr[-2000:]
    return [line for line in r.stderr.splitlines() if ":CONSOLE" in line]


def colour_pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    from PIL import Image

    with Image.open(png) as im:
        pixels = im.convert("RGB").getdata()
        return sum(1 for p in pixels if all(abs(a - b) <= 8 for a, b in zip(p, rgb, strict=True)))


@pytest.mark.parametrize("kind", ["stats", "diff"])
def test_report_is_self_contained_with_latency_plots(reports: dict[str, Path], kind: str) -> None:
    html = reports[kind].read_text(encoding="utf-8")
    assert oct(reports[kind].stat().st_mode & 0o777) == "0o600"
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", html, re.I)
    assert "url(" not in html
    for title in ("Time to first token", "Inter-token latency (per output)"):
        # the plot: an SVG with its title, both axes' titles (x with its unit) and bars
        m = re.search(rf'<svg[^>]*aria-label="{re.escape(title)}".*?</svg>', html, re.S)
        assert m, title
        svg = m.group(0)
        assert f"{title} (ms)</text>" in svg
        assert ">outputs</text>" in svg
        for label in LABELS:
            colour = "#{:02x}{:02x}{:02x}".format(*COLOURS[label])
            bars = re.findall(rf'<rect [^>]*fill="{colour}"><title>{label}: (\d+) in ', svg)
            assert bars, (title, label)
        ticks = re.findall(r'text-anchor="middle">([0-9.e+-]+)</text>', svg)
        assert len(ticks) >= 5, ticks  # x ticks, values in the unit


@needs_chromium
@pytest.mark.parametrize("kind", ["stats", "diff"])
def test_report_renders_in_chromium(reports: dict[str, Path], kind: str, tmp_path: Path) -> None:
    png = screenshot_dir(tmp_path) / f"{kind}-html.png"
    console = chromium(reports[kind], png, tmp_path / "profile", HEIGHTS[kind])
    assert console == [], console
    # the bars are on the screen, in both labels' colours
    for label, rgb in COLOURS.items():
        assert colour_pixels(png, rgb) > 200, (label, png)


@needs_chromium
def test_a_console_error_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>x</p>"
        "<script>console.error('drawn wrong')</script></body></html>",
        encoding="utf-8",
    )
    console = chromium(page, tmp_path / "bad.png", tmp_path / "profile", 400)
    assert any("drawn wrong" in line for line in console), console
    assert colour_pixels(tmp_path / "bad.png", COLOURS["dense"]) == 0
