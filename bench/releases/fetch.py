"""Write `engine_releases.json`: each engine's releases on PyPI and the day each was first
uploaded, which the published suite's converter reads for a source that does not state its
engine version (`bench/published_rows.py`, `release_at`).

    python bench/releases/fetch.py   # needs the PyPI JSON API (https://pypi.org/pypi/NAME/json)

Pre-releases (rc, dev, alpha, beta) and yanked files are left out.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from packaging.version import InvalidVersion, Version

OUT = Path(__file__).with_name("engine_releases.json")
PACKAGES = {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "tensorrt-llm",
            "lmdeploy-turbomind": "lmdeploy"}  # kvpd engine name -> PyPI package
API = "https://pypi.org/pypi/{}/json"


def releases(package: str) -> dict[str, str]:
    """release -> the day (YYYY-MM-DD, UTC) its first file was uploaded, oldest first."""
    with urllib.request.urlopen(API.format(package), timeout=60) as r:  # noqa: S310 (fixed URL)
        data = json.load(r)
    out = []
    for text, files in data["releases"].items():
        files = [f for f in files if not f.get("yanked")]
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if files and not v.is_prerelease:
            out.append((min(f["upload_time"] for f in files)[:10], v, text))
    return {text: day for day, _, text in sorted(out)}


def main() -> None:
    table = {"source": "PyPI JSON API (" + API.format("NAME") + "): the first upload of each "
                       "release's files, pre-releases and yanked files left out",
             "engines": {engine: releases(pkg) for engine, pkg in PACKAGES.items()}}
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{e} {len(r)}" for e, r in table["engines"].items()))


if __name__ == "__main__":
    main()
