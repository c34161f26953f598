"""The dashboard's web assets.

`web/` holds the sources (our page, script and styles, and `package.json` naming the charting
library, uPlot, from npm); `make dashboard` runs `npm ci` and `web/build.mjs`, which writes the
page and content-hashed assets into `static/` (not committed; included in wheels). The backend
serves them from there (`backend/routes/dashboard.py`); nothing is fetched at run time.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).with_name("static")
INDEX = "index.html"
ASSETS = "assets"
