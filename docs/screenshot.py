"""Screenshots of the built book, to look at how its pages render.

    python docs/book.py build --strict        # pixi run docs-build: the site in build/site
    python docs/screenshot.py                 # the front page and step 07's -> build/screenshots/
    python docs/screenshot.py steps/step-02 running

A strict build proves the links hold, not that a page reads well (a table too wide,
a diagram broken out of its fence, a picture too small): for that, look. Each PAGE is
a folder of build/site (mkdocs gives every page its own index.html) and is rendered by
headless Chromium (Debian: `apt-get install chromium`) in a 1280x1600 window into
build/screenshots/PAGE.png, which git ignores like the rest of build/.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "build" / "site"
OUT = ROOT / "build" / "screenshots"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def screenshot(browser: str, page: str, out: Path, height: int = 1600) -> Path:
    html = SITE / page / "index.html"
    if not html.is_file():
        raise FileNotFoundError(f"{html.relative_to(ROOT)}: no such page (build the book first: pixi run docs-build)")
    png = out / f"{page.strip('/').replace('/', '_') or 'index'}.png"
    # --no-sandbox: Chromium's sandbox refuses to start as root (containers, CI).
    subprocess.run([browser, "--headless", "--no-sandbox", "--hide-scrollbars", f"--window-size=1280,{height}",
                    f"--screenshot={png}", html.as_uri()], check=True, capture_output=True, timeout=120)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python docs/screenshot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("pages", nargs="*", default=["", "steps/step-07"],
                   help="folders of build/site (default: the front page and step 07's)")
    p.add_argument("--out", type=Path, default=OUT, help=f"where the PNGs go (default: {OUT.relative_to(ROOT)})")
    p.add_argument("--height", type=int, default=1600, help="window height in pixels: the part of a long page "
                   "that is shot (default: 1600)")
    args = p.parse_args(argv)
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print(f"screenshot: none of {', '.join(BROWSERS)} found (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for page in args.pages:
        try:
            print(screenshot(browser, page, args.out, args.height))
        except FileNotFoundError as exc:
            print(f"screenshot: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
