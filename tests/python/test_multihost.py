"""Multi-host on one machine: network namespaces joined by veth pairs to a bridge stand for a
coordinator's host and three worker hosts (two kiln-workers each), with UCX over TCP between them
and tokens (the daemons listen beyond loopback). A 2x2 FSDP x TP job is placed one tensor-parallel
group per host (Note [Placement]); the test cuts one of its hosts' links mid-job, and the job
restarts from its checkpoint on the other two hosts (Note [Restarts]) and ends at an uninterrupted
run's loss, bit for bit. Needs root (as CI runs) and `ip netns`; skips with the reason otherwise."""
import json
import os
import subprocess
import sys
import time

import pytest

from gang_jobs import CLI
from test_chaos import DRIVER, STEPS, EVERY, final_line
from test_remote_worker import COORDINATOR, WORKER

TOKEN, WORKER_TOKEN = "tenant-token-1", "worker-token-1"
HOSTS = ["coord", "h1", "h2", "h3"]  # 10.77.0.1 .. 10.77.0.4


def ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@pytest.fixture
def hosts():
    """The namespaces (by host name) on one bridge; removed afterwards."""
    tag = f"k{os.getpid() % 100000}"
    names = {h: f"{tag}{h}" for h in HOSTS}
    switch = f"{tag}sw"
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if ip("netns", "add", switch, check=False).returncode != 0:
        pytest.skip("cannot create network namespaces here (ip netns add failed)")
    made = [switch]
    try:
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        for i, h in enumerate(HOSTS):
            ns = names[h]
            ip("netns", "add", ns)
            made.append(ns)
            a, b = f"{tag}a{i}", f"{tag}b{i}"
            ip("link", "add", a, "type", "veth", "peer", "name", b)
            ip("link", "set", a, "netns", ns)
            ip("link", "set", b, "netns", switch)
            ip("-n", ns, "link", "set", a, "name", "eth0")
            ip("-n", ns, "addr", "add", f"10.77.0.{i + 1}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", switch, "link", "set", b, "master", "br0")
            ip("-n", switch, "link", "set", b, "up")
        yield {"ns": names, "switch": switch, "link": {h: f"{tag}b{i}" for i, h in enumerate(HOSTS)}}
    finally:
        for ns in made:
            ip("netns", "del", ns, check=False)


def start_in(ns, tmp_path, name, argv, host, env):
    """A daemon in namespace `ns`, listening on `host`; returns (process, "host:port")."""
    port_file = tmp_path / f"{name}.port"
    log = open(tmp_path / f"{name}.log", "w")
    p = subprocess.Popen(["ip", "netns", "exec", ns, *argv, "--listen", f"{host}:0",
                          "--port-file", str(port_file)], stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return p, f"{host}:{int(port_file.read_text().strip())}"
        if p.poll() is not None:
            break
        time.sleep(0.02)
    p.kill()
    raise RuntimeError(f"{name} did not start: {(tmp_path / f'{name}.log').read_text()}")


def test_a_job_survives_a_cut_link_between_hosts(hosts, tmp_path):
    if not (os.access(COORDINATOR, os.X_OK) and os.access(WORKER, os.X_OK)):
        pytest.skip("kiln-coordinator or kiln-worker is not built")
    ns = hosts["ns"]
    (tmp_path / "tokens").write_text(f"alice {TOKEN}\n")
    # UCX over TCP on each host's one interface (no shared memory between "hosts").
    env = dict(os.environ, UCX_TLS="tcp,self", UCX_NET_DEVICES="eth0", KILN_UCX_SHM="0",
               KILN_COMM_TIMEOUT_S="10", OMP_NUM_THREADS="1", KILN_TOKEN=WORKER_TOKEN)
    procs = []
    try:
        c, coord = start_in(ns["coord"], tmp_path, "coordinator",
                            [COORDINATOR, "--state", str(tmp_path / "state.db"), "--tokens",
                             str(tmp_path / "tokens"), "--worker-token", WORKER_TOKEN,
                             "--heartbeat-ms", "200", "--dead-after", "3"], "10.77.0.1", env)
        procs.append(c)
        for i, h in enumerate(["h1", "h2", "h3"]):
            for k in range(2):
                procs.append(start_in(ns[h], tmp_path, f"{h}w{k}",
                                      [WORKER, "--worker-id", f"{h}w{k}", "--coordinator",
                                       coord, "--token", WORKER_TOKEN], f"10.77.0.{i + 2}",
                                      env)[0])
        client_env = dict(env, KILN_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join(sys.path))

        def kiln(*args):
            r = subprocess.run(["ip", "netns", "exec", ns["coord"], CLI, *args, "--coordinator",
                                coord], capture_output=True, text=True, env=client_env,
                               timeout=30)
            assert r.returncode == 0, r.stdout + r.stderr
            return r.stdout

        deadline = time.monotonic() + 20
        while len(kiln("workers", "--json").splitlines()) < 6:
            assert time.monotonic() < deadline, kiln("workers")
            time.sleep(0.1)
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)

        def submit(*args, **extra):
            return subprocess.Popen(["ip", "netns", "exec", ns["coord"], CLI, "submit",
                                     "--coordinator", coord, "--mesh", "dp=2,tp=2", *args, "--",
                                     sys.executable, str(driver), str(STEPS)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=dict(client_env, **extra))

        ref = submit()
        out, _ = ref.communicate(timeout=300)
        assert ref.returncode == 0, out
        want = final_line(out)
        go = tmp_path / "go"
        p = submit("--max-restarts", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                   "--checkpoint-every", str(EVERY), CHAOS_PAUSE_AT="7", CHAOS_GO=str(go))
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("step 7 "):
                break
        job = [json.loads(j) for j in kiln("jobs", "--json").splitlines()][-1]
        gang_hosts = sorted({a.rsplit(":", 1)[0] for a in job["worker_addresses"]})
        assert len(gang_hosts) == 2, job   # one tensor-parallel group per host
        cut = HOSTS[int(gang_hosts[0].rsplit(".", 1)[1]) - 1]
        ip("-n", hosts["switch"], "link", "set", hosts["link"][cut], "down")
        go.write_text("")
        rest, _ = p.communicate(timeout=300)
        out = "".join(lines) + rest
        assert p.returncode == 0, out
        assert "resume from 6" in out and final_line(out) == want, out
        status = json.loads(kiln("status", job["job_id"], "--json"))
        assert status["state"] == "succeeded" and status["restarts"] >= 1, status
        assert not any(a.startswith(gang_hosts[0] + ":") for a in status["worker_addresses"]), status
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
