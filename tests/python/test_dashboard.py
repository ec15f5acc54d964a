"""The coordinator's web dashboard (coordinator/src/dashboard.h, Note [Dashboard auth] in
dashboard.cpp) against a live kiln-coordinator with tenants alice and bob, a worker token and two
real kiln-workers running alice's job: it trains 8 steps with step telemetry and a straggler
(rank 1 does extra work each step, as in test_telemetry.py), then waits until the test is done.
The JSON API is checked with urllib (auth, tenants, bad input); the page is loaded in headless
Chromium (Debian's `chromium`; that test skips without it), its DOM checked and a screenshot
saved in the test's temp dir."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser

import pytest

from gang_jobs import STRAGGLER_DRIVER, coordinator_and_workers, submit
from test_remote_worker import COORDINATOR, start_daemon, stop

STEPS = 8  # gang_jobs.STRAGGLER_DRIVER's default

def get(port, path, token=None, host=None):
    """(status, headers, body: parsed JSON, or text) of a GET to the dashboard."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, headers, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    text = raw.decode()
    return status, headers, json.loads(text) if "json" in headers["Content-Type"] else text


def start_coordinator(tmp_path, extra):
    """A kiln-coordinator with a dashboard on a free loopback port: (process, address, port)."""
    port_file = tmp_path / "dashboard.port"
    p, address = start_daemon(tmp_path, "coordinator",
                              [COORDINATOR, "--state", str(tmp_path / "state.db"),
                               "--dashboard-listen", "127.0.0.1:0",
                               "--dashboard-port-file", str(port_file), *extra])
    return p, address, int(port_file.read_text())  # written before the gRPC port file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Alice's job, running on two workers, past its 8 steps and its straggler finding."""
    tmp_path = tmp_path_factory.mktemp("dashboard")
    tokens = tmp_path / "tokens"
    tokens.write_text("alice atok\nbob btok\n")
    release, port_file = tmp_path / "release", tmp_path / "dashboard.port"
    with coordinator_and_workers(tmp_path, 2, prefix="dash", worker_args=["--token", "wtok"],
                                 coordinator_args=["--tokens", str(tokens), "--worker-token", "wtok",
                                                   "--dashboard-listen", "127.0.0.1:0",
                                                   "--dashboard-port-file", str(port_file)]) as address:
        port = int(port_file.read_text())  # written before the gRPC port file
        env = {k: v for k, v in os.environ.items() if k != "KILN_TOKEN"}
        sub = submit(address, tmp_path, STRAGGLER_DRIVER, 2, args=[release],
                     cli_args=["--token", "atok"], env=env)
        try:
            deadline = time.monotonic() + 240
            while True:
                assert sub.poll() is None, sub.stdout.read()
                _, _, jobs = get(port, "/api/jobs", "atok")
                job = jobs["jobs"][0] if jobs["jobs"] else None
                if job and [r["step"] for r in job["last_steps"]] == [STEPS, STEPS] and \
                        any(f["kind"] == "straggler" for f in job["findings"]):
                    _, _, logs = get(port, f"/api/jobs/{job['job_id']}/logs", "atok")
                    if any(l.startswith("trained") for l in logs["lines"]):
                        break
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
            yield {"port": port, "job": job, "tmp_path": tmp_path}
        finally:
            release.write_text("")
            try:
                sub.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                sub.kill()
                sub.wait()


def test_api_answers_each_tenant_its_own_and_refuses_bad_input(cluster):
    port, job_id = cluster["port"], cluster["job"]["job_id"]
    # A missing, a wrong and the worker's token: 401, with a JSON error.
    for token in (None, "nope", "wtok"):
        status, headers, body = get(port, "/api/jobs", token)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (token, body)
        assert "error" in body
    # Alice sees her job, with its findings and each rank's last step; Bob neither lists it nor
    # reads it (an unknown job); both see the two workers.
    _, _, jobs = get(port, "/api/jobs", "atok")
    assert [(j["job_id"], j["state"], j["tenant"]) for j in jobs["jobs"]] == \
        [(job_id, "running", "alice")]
    status, _, job = get(port, f"/api/jobs/{job_id}", "atok")
    assert status == 200 and sorted(r["rank"] for r in job["last_steps"]) == [0, 1]
    assert any(f["kind"] == "straggler" and f["text"].startswith("rank 1") for f in job["findings"])
    _, _, theirs = get(port, "/api/jobs", "btok")
    assert theirs == {"jobs": []}
    for path in ("", "/steps", "/logs"):
        status, _, body = get(port, f"/api/jobs/{job_id}{path}", "btok")
        assert status == 404 and body == {"error": f"unknown job {job_id}"}, (path, body)
    for token in ("atok", "btok"):
        _, _, workers = get(port, "/api/workers", token)
        assert sorted(w["worker_id"] for w in workers["workers"]) == ["dash0", "dash1"]
    # Steps from a step on, by step then rank; the log's tail.
    _, _, steps = get(port, f"/api/jobs/{job_id}/steps?from=6", "atok")
    assert [(r["step"], r["rank"]) for r in steps["steps"]] == \
        [(n, k) for n in range(6, STEPS + 1) for k in (0, 1)]
    assert all(r["tokens"] == 64 and "loss" in r for r in steps["steps"])
    _, _, logs = get(port, f"/api/jobs/{job_id}/logs?tail=2", "atok")
    assert len(logs["lines"]) == 2 and logs["lines"][0].startswith(f"loss {STEPS} "), logs
    # Bad input: a clear 4xx with a JSON error, and the daemon carries on.
    for path, status, words in [
            (f"/api/jobs/{job_id}/logs?tail=0", 400, "tail must be an integer in [1, 1000]"),
            (f"/api/jobs/{job_id}/logs?tail=99999999999999999999", 400, "tail must be"),
            (f"/api/jobs/{job_id}/logs?tail=abc", 400, "got 'abc'"),
            (f"/api/jobs/{job_id}/steps?from=-1", 400, "from must be an integer >= 0"),
            (f"/api/jobs/{job_id}/steps?from=1x", 400, "from must be"),
            (f"/api/jobs/{job_id}/steps?limit=0", 400, "limit must be"),
            ("/api/jobs/job-999", 404, "unknown job job-999"),
            ("/api/jobs/", 400, "job_id is required"),
            ("/api/jobs?state=sleeping", 400, "state must be one of"),
            (f"/api/jobs/{job_id}/nope", 404, "no such endpoint"),
            ("/api/nope", 404, "no such endpoint"),
            ("/nope.html", 404, "not found")]:
        got, _, body = get(port, path, "atok")
        assert got == status and words in body["error"], (path, got, body)
    # The page: anyone may load it (it holds no data), never cached, no inline script.
    status, headers, page = get(port, "/")
    assert status == 200 and 'id="loss-curve"' in page
    assert headers["Cache-Control"] == "no-store"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert get(port, "/dashboard.js")[1]["Content-Type"].startswith("text/javascript")


def test_without_tokens_loopback_only(tmp_path):
    """Auth off: no token needed, but only loopback names (a DNS-rebound site gets 403), and the
    daemon refuses to serve the dashboard beyond loopback."""
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    c, _, port = start_coordinator(tmp_path, [])
    try:
        status, _, body = get(port, "/api/jobs")
        assert status == 200 and body == {"jobs": []}
        assert get(port, "/api/workers", host=f"localhost:{port}")[0] == 200
        status, _, body = get(port, "/api/jobs", host="evil.example")
        assert status == 403 and "loopback" in body["error"]
    finally:
        stop(c)
    r = subprocess.run([COORDINATOR, "--state", str(tmp_path / "other.db"), "--listen",
                        "127.0.0.1:0", "--dashboard-listen", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "refusing to listen on '0.0.0.0:0'" in r.stderr, r.stderr


class Elements(HTMLParser):
    """The text, and the start tags with their attributes, inside each element with an id."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self, html):
        super().__init__()
        self.open = []  # the ids being recorded, innermost last
        self.depth, self.opened_at = 0, {}
        self.text, self.tags, self.attrs = {}, {}, {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for id_ in self.open:
            self.tags[id_].append((tag, attrs))
        if tag in self.VOID:
            return
        self.depth += 1
        if "id" in attrs:
            self.open.append(attrs["id"])
            self.text[attrs["id"]], self.tags[attrs["id"]] = "", []
            self.attrs[attrs["id"]] = attrs
            self.opened_at[attrs["id"]] = self.depth

    def handle_startendtag(self, tag, attrs):  # <polyline ... /> in SVG
        for id_ in self.open:
            self.tags[id_].append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.open and self.opened_at[self.open[-1]] == self.depth:
            self.open.pop()
        self.depth -= 1

    def handle_data(self, data):
        for id_ in self.open:
            self.text[id_] += data


def chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("chromium is not installed (scripts/bootstrap installs Debian's chromium)")


def browse(tmp_path, url, *flags):
    """Chromium, headless, on `url` with 5 s of virtual time (the page's first polls)."""
    r = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'chromium-profile'}",
                        "--virtual-time-budget=5000", *flags, url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_page_in_headless_chromium(cluster):
    port, job_id, tmp_path = cluster["port"], cluster["job"]["job_id"], cluster["tmp_path"]
    url = f"http://127.0.0.1:{port}/?job={job_id}"
    dom = Elements(browse(tmp_path, f"{url}#token=atok", "--dump-dom"))
    assert job_id in dom.text["jobs"] and "running" in dom.text["jobs"], dom.text["jobs"]
    assert "dash0" in dom.text["workers"] and "dash1" in dom.text["workers"], dom.text["workers"]
    lines = {a["data-rank"]: a["points"].split() for t, a in dom.tags["loss-curve"]
             if t == "polyline"}
    assert sorted(lines) == ["0", "1"] and len(lines["0"]) == STEPS, lines
    ranks = [a["data-rank"] for t, a in dom.tags["step-times"] if t == "tr" and "data-rank" in a]
    assert ranks == ["0", "1"], dom.text["step-times"]
    assert len(re.findall(r"\d\.\d{3}", dom.text["step-times"])) >= 4, dom.text["step-times"]
    assert "straggler" in dom.text["findings"] and "rank 1" in dom.text["findings"]
    assert f"loss {STEPS} " in dom.text["log"] and "trained" in dom.text["log"], dom.text["log"]
    assert "hidden" in dom.attrs["token-form"]

    # Bob's token: his (empty) job list, and Alice's job is unknown to him.
    bob = Elements(browse(tmp_path, f"{url}#token=btok", "--dump-dom"))
    assert job_id not in bob.text["jobs"] and "dash0" in bob.text["workers"]
    assert f"unknown job {job_id}" in bob.text["job-message"], bob.text["job-message"]
    assert "straggler" not in bob.text["findings"] and "loss" not in bob.text["log"]
    # A wrong token: nothing shown, the token form offered.
    wrong = Elements(browse(tmp_path, f"{url}#token=nope", "--dump-dom"))
    assert "invalid token" in wrong.text["status"] and job_id not in wrong.text["jobs"]
    assert "hidden" not in wrong.attrs["token-form"]

    shot = tmp_path / "dashboard.png"
    browse(tmp_path, f"{url}#token=atok", f"--screenshot={shot}", "--window-size=1280,900")
    print(f"dashboard screenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
