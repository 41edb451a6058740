"""Open a report in headless Chromium and check that its charts are drawn.

Each chart is located by rendering the page a second time with that chart's SVG emptied
(same size, so nothing else moves): the pixels that change are the chart's drawing. A chart
that is blank, or covered, or not rendered at all changes nothing and fails the check.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageChops, ImageStat

WIDTH, HEIGHT = 1280, 7000
_FIGURE = re.compile(
    r'(<figure class="chart" id="chart-([\w-]+)">)(<svg\b[^>]*>)(.*?)(</svg>)', re.S
)
EXTERNAL = re.compile(
    r"""(?:\b(?:src|href|xlink:href|action|poster|srcset)\s*=\s*["']?\s*(?:https?:|//|ftp:|file:))"""
    r"""|(?:url\(\s*["']?\s*(?:https?:|//))|(?:@import)""",
    re.I,
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html: Path, png: Path) -> Image.Image:
    browser = chromium()
    assert browser is not None, "chromium is not installed"
    with tempfile.TemporaryDirectory(prefix="pm-chrome-") as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--disable-dev-shm-usage",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{HEIGHT}",
                f"--screenshot={png}",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return Image.open(png).convert("RGB")


@dataclass(frozen=True)
class ChartCheck:
    ident: str
    box: tuple[int, int, int, int] | None
    changed: int
    stddev: float
    colours: int


def chart_ids(text: str) -> list[str]:
    return [m.group(2) for m in _FIGURE.finditer(text)]


def blank(text: str, ident: str) -> str:
    """The page with chart ``ident``'s SVG emptied, its size kept."""
    return _FIGURE.sub(
        lambda m: m.group(1) + m.group(3) + m.group(5) if m.group(2) == ident else m.group(0), text
    )


def check_charts(html: Path, out_dir: Path) -> tuple[Path, list[ChartCheck]]:
    """Screenshot the page, then find and measure each chart's drawn region."""
    text = html.read_text()
    full_png = out_dir / f"{html.stem}.png"
    full = screenshot(html, full_png)
    results = []
    for ident in chart_ids(text):
        other = out_dir / f"{html.stem}-without-{ident}.html"
        other.write_text(blank(text, ident))
        without = screenshot(other, out_dir / f"{html.stem}-without-{ident}.png")
        diff = ImageChops.difference(full, without)
        box = diff.getbbox()
        if box is None:
            results.append(ChartCheck(ident, None, 0, 0.0, 0))
            continue
        changed = diff.convert("L").point(lambda p: 255 if p > 16 else 0).histogram()[255]
        region = full.crop(box)
        stddev = max(ImageStat.Stat(region).stddev)
        colours = len(region.getcolors(maxcolors=1 << 20) or [])
        results.append(ChartCheck(ident, box, changed, stddev, colours))
    return full_png, results
