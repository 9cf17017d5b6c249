"""The status page `/` of `swarmkv serve` in a real headless browser (Debian's chromium), while
streaming completions run. Proven: the page's script fetches /v1/status and fills in the
model name, the fingerprint and the live and queued counts the server reports at that moment
(not the placeholder "–"); with --api-key, a key given as `#key=...` in the URL gets the same
numbers, and without it the page says the status is unavailable; a screenshot of the page is
a real 1200x900 render (a copy of the first goes to /tmp/serve-status.png).

CI installs the browser as root: `apt-get update && apt-get install -y chromium`. A missing
chromium fails these tests instead of skipping them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from support.serving import Served, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.serve]

KEY = "sk-page-test-0123456789"
STREAMS = 6
MAX_LIVE = 2  # of the 6 streams, 2 decode and the rest wait: the page shows both numbers
CTX = 4096  # the tiny model's n_ctx_train; two requests of MAX_TOKENS fit, not three
# Long enough that the queue stays non-empty while the browser runs (two pairs of streams
# decode at least this many tokens each first); the streams are closed after.
MAX_TOKENS = 1900
SHOT = Path("/tmp/serve-status.png")
INSTALL = "apt-get update && apt-get install -y chromium"


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(f"no chromium on PATH; as root: {INSTALL}")
    return found


def browse(chromium: str, url: str, tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """One headless chromium run on url (its own profile; 3 s of virtual time for the page's
    script: the first refresh and two more)."""
    cmd = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=3000",
        *flags, url,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def element(dom: str, id_: str) -> str:
    """The text of the element with this id in a dumped DOM."""
    m = re.search(rf'<(\w+)[^>]*\bid="{id_}"[^>]*>(.*?)</\1>', dom, re.S)
    assert m is not None, f"no #{id_} in the page"
    return m.group(2).strip()


@contextmanager
def running_streams(served: Served, key: str | None) -> Iterator[dict[str, Any]]:
    """STREAMS streaming completions from threads, read until the block ends, then closed
    (the server cancels them). Yields /v1/status once all are admitted."""
    client = openai.OpenAI(base_url=served.v1, api_key=key or "unused", max_retries=0)
    done = threading.Event()
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            stream = client.completions.create(
                model="", prompt=f"Stream {i} reads the page.", max_tokens=MAX_TOKENS,
                stream=True, temperature=0,
            )  # fmt: skip
            with stream:
                for _ in stream:
                    if done.is_set():
                        break
        except BaseException as exc:  # the test body asserts on it
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    status = served.status(key)
    while status["live"] + status["queued"] < STREAMS or status["live"] < MAX_LIVE:
        assert time.monotonic() < deadline, f"the streams did not start: {status}"
        time.sleep(0.05)
        status = served.status(key)
    try:
        yield status
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not errors, errors


def assert_page_shows(dom: str, status: dict[str, Any], model_id: str) -> None:
    """The script filled the page in from /v1/status: no placeholder left, and the numbers
    the server reported while the browser ran (status: each count's (before, after))."""
    assert element(dom, "error") == "", element(dom, "error")
    assert element(dom, "model") == model_id
    assert element(dom, "fingerprint") == f"fingerprint {status['fingerprint']}"
    for id_ in ("live", "queued", "tps", "hit", "finished"):
        assert element(dom, id_) not in ("", "–"), f"#{id_} not filled in"
    assert int(element(dom, "live")) == MAX_LIVE
    assert status["queued"][1] <= int(element(dom, "queued")) <= status["queued"][0]
    assert status["finished"][0] <= int(element(dom, "finished")) <= status["finished"][1]
    assert float(element(dom, "tps")) > 0  # streams decode: their tokens count as they come
    assert f"of {status['n_ctx']} in use" in element(dom, "cells")


def assert_real_render(png: Path) -> None:
    assert png.is_file() and png.stat().st_size > 10_000, png
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size == (1200, 900), (img.format, img.size)
        colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 20, "an empty or one-colour screenshot"
    background = max(colors)[0]
    assert background < 0.99 * 1200 * 900, "the page drew almost nothing"


def steady_status(served: Served, key: str | None, wait_s: float = 2.0) -> dict[str, Any]:
    """/v1/status with MAX_LIVE live, read again for up to wait_s: a stream that has just
    ended leaves its place empty until the engine's next step admits a waiting one, and a
    reading can fall in between (CI caught one: live 1, queued 3)."""
    deadline = time.monotonic() + wait_s
    status = served.status(key)
    while status["live"] != MAX_LIVE and status["queued"] and time.monotonic() < deadline:
        time.sleep(0.01)
        status = served.status(key)
    return status


def page_run(
    chromium: str, served: Served, tmp: Path, key: str | None
) -> tuple[str, Path, dict[str, Any]]:
    """Dump the page's DOM and screenshot it while the streams run. Before and after, MAX_LIVE
    streams decode and some wait, so the page must show MAX_LIVE live, and queued and
    finished counts between the two readings."""
    model_id = httpx.get(
        served.v1 + "/models", headers={"Authorization": f"Bearer {key}"} if key else {}
    ).json()["data"][0]["id"]
    url = served.base + "/" + (f"#key={key}" if key else "")
    png = tmp / "status.png"
    with running_streams(served, key) as before:
        dom = browse(chromium, url, tmp, "--dump-dom").stdout
        browse(chromium, url, tmp, f"--screenshot={png}", "--window-size=1200,900")
        after = steady_status(served, key)
    for st in (before, after):
        assert st["live"] == MAX_LIVE and st["queued"] >= 1, (before, after)
    both = {k: (before[k], after[k]) for k in ("queued", "finished")}
    assert_page_shows(dom, {**after, **both}, model_id)
    assert_real_render(png)
    return dom, png, after


def test_the_page_shows_live_numbers_while_streams_run(
    chromium: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    args = ["-m", str(tiny_model_path), "-c", str(CTX), "-t", "2", "--max-live", str(MAX_LIVE)]
    with serve_process(args, tmp_path) as served:
        _, png, _ = page_run(chromium, served, tmp_path, None)
    shutil.copyfile(png, SHOT)


def test_the_page_takes_its_key_from_the_url_hash(
    chromium: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    args = ["-m", str(tiny_model_path), "-c", str(CTX), "-t", "2", "--max-live", str(MAX_LIVE)]
    args += ["--api-key", KEY]
    with serve_process(args, tmp_path) as served:
        page_run(chromium, served, tmp_path, KEY)
        # the page itself needs no key; without one in the hash its fetch gets 401
        dom = browse(chromium, served.base + "/", tmp_path, "--dump-dom").stdout
    assert element(dom, "error").startswith("status unavailable: a valid API key is required")
    assert element(dom, "live") == "–"
