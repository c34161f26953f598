"""The dashboard's page and assets as the backend serves them: caching, types, no CDN."""

from __future__ import annotations

import re

import httpx

from tests.support.backend_server import BackendServer


def test_page_and_assets_are_served_with_their_caching(sqlite_backend: BackendServer) -> None:
    url = sqlite_backend.url
    root = httpx.get(f"{url}/dashboard", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/dashboard/overview"
    page = httpx.get(f"{url}/dashboard/policies")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in page.headers["content-security-policy"]
    # Everything the page loads comes from this server: no CDN, nothing fetched elsewhere.
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/dashboard/") or s.startswith("data:") for s in sources)
    assets = [s for s in sources if s.startswith("/dashboard/assets/")]
    assert len(assets) == 4
    for path in assets:
        asset = httpx.get(url + path)
        assert asset.status_code == 200
        assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"
        kind = "text/javascript" if path.endswith(".js") else "text/css"
        assert asset.headers["content-type"].startswith(kind)
        again = httpx.get(url + path, headers={"If-None-Match": asset.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    assert httpx.get(f"{url}/dashboard/assets/nothing.js").status_code == 404
    assert httpx.get(f"{url}/dashboard/assets/..%2Fstatic").status_code == 404
    assert httpx.get(f"{url}/dashboard/secrets").status_code == 404
