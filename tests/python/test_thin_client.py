"""The thin client (cmake -DKILN_CLIENT_ONLY=ON, README "A thin client"): tensor with meta
functions only, autograd, nn/optim, the wire layer and the Remote backend, no kernels, oneDNN,
OpenMP or UCX, in C++ and as the Python package. It is configured and built into build-client/
(objects come from ccache when the full build compiled them). Its examples/thin_client, and the
same program in Python on its package, train an MLP on a kiln-worker of the full build with every
parameter made on the worker (kiln/default_device.h), and print the same losses as the full
build; it links none of the kernel libraries, and its size is printed beside the full build's.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__))))
THIN = os.path.join(ROOT, "build-client")
WORKER = os.path.join(BUILD, "bin", "kiln-worker")
FULL_BIN = os.path.join(BUILD, "bin", "thin_client")


def _closure(binary):
    """{library name: path} of everything `binary` loads."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m and os.path.exists(m.group(2)):
            libs[m.group(1)] = m.group(2)
    return libs


@pytest.fixture(scope="module")
def thin_binary():
    if shutil.which("ninja") is None or not os.path.exists(FULL_BIN):
        pytest.skip("needs ninja and the full build's thin_client")
    env = dict(os.environ, CCACHE_BASEDIR=ROOT)
    if not os.path.exists(os.path.join(THIN, "build.ninja")):
        subprocess.run(["cmake", "-S", ROOT, "-B", THIN, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DKILN_CLIENT_ONLY=ON", "-DKILN_TESTS=OFF", "-DKILN_PYTHON=ON",
                        f"-DPython3_EXECUTABLE={sys.executable}"],
                       check=True, env=env, capture_output=True)
    r = subprocess.run(["cmake", "--build", THIN, "-j", os.environ.get("KILN_JOBS", "2")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return os.path.join(THIN, "bin", "thin_client")


@pytest.fixture
def worker(tmp_path):
    port_file = tmp_path / "port"
    p = subprocess.Popen([WORKER, "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            assert p.poll() is None, "kiln-worker exited at start"
            time.sleep(0.05)
        yield f"127.0.0.1:{port_file.read_text().strip()}"
    finally:
        p.kill()
        p.wait()


def _losses(binary, address):
    r = subprocess.run([binary, address, "5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [float(line.split()[-1]) for line in r.stdout.splitlines()]


def test_thin_client_trains_on_a_worker_like_the_full_build(thin_binary, worker):
    thin = _losses(thin_binary, worker)
    full = _losses(FULL_BIN, worker)
    assert len(thin) == 5 and thin == full  # the same program, recorded the same way
    assert thin[-1] < thin[0]


def test_thin_client_links_no_kernels(thin_binary):
    thin, full = _closure(thin_binary), _closure(FULL_BIN)
    for lib in thin:
        assert not re.match(r"lib(dnnl|gomp|ucp|ucs|uct|kiln_kernels|kiln_sharding|kiln_worker|"
                            r"cuda|cublas|nccl)", lib), lib
    assert any(lib.startswith("libkiln_kernels_cpu") for lib in full)

    def size(libs, own):
        mine = sum(os.path.getsize(p) for n, p in libs.items() if n.startswith("libkiln"))
        return (mine + os.path.getsize(own)) / 2**20, sum(map(os.path.getsize, libs.values())) / 2**20

    (t_own, t_all), (f_own, f_all) = size(thin, thin_binary), size(full, FULL_BIN)
    print(f"thin client: Kiln's libraries {t_own:.1f} MB, with everything it loads {t_all:.1f} MB; "
          f"full build: {f_own:.1f} MB, {f_all:.1f} MB")
    assert t_own < f_own


def test_thin_client_names_a_bad_address(thin_binary):
    r = subprocess.run([thin_binary, "127.0.0.1:1", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "thin_client:" in r.stderr and "127.0.0.1:1" in r.stderr, r.stderr


def test_default_device_makes_a_model_on_the_worker(worker):
    s = kiln.connect(worker)
    try:
        kiln.set_default_device(s.device)
        try:
            kiln.manual_seed(0)
            m = kiln.nn.Linear(8, 4)
            x = kiln.randn(5, 8)
            assert m.weight.device == s.device and x.device == s.device
            assert kiln.tensor([1.0, 2.0]).device == s.device  # data is uploaded
            assert kiln.from_numpy(kiln.zeros(2, device="cpu").numpy()).device.type == "cpu"
            assert kiln.get_default_device() == s.device
            remote = m(x).sum().item()
        finally:
            kiln.set_default_device("cpu")
        kiln.manual_seed(0)  # the same counters, drawn on this process's CPU
        m, x = kiln.nn.Linear(8, 4), kiln.randn(5, 8)
        assert m.weight.device.type == "cpu"
        assert abs(m(x).sum().item() - remote) < 1e-5
        with pytest.raises(TypeError, match="set_default_device"):
            kiln.set_default_device(3)
    finally:
        s.close()


PROGRAM = """
import sys
import kiln
import kiln.nn as nn
import kiln.nn.functional as F
s = kiln.connect(sys.argv[1])
kiln.set_default_device(s.device)
kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)
x, y = kiln.randn(512, 784), kiln.randint(0, 10, (512,))
for step in range(1, 6):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
try:
    kiln.compile(model)
except NotImplementedError as e:
    print("compile:", e)
try:
    kiln.zeros(2, device="cpu") + 1
except NotImplementedError as e:
    print("cpu op:", e)
try:
    import kiln.distributed  # noqa: F401
except ImportError as e:
    print("distributed:", e)
s.close()
"""


def test_thin_python_package_trains_like_the_c_plus_plus_client(thin_binary, worker, tmp_path):
    script = tmp_path / "thin.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=os.path.join(THIN, "python"))
    r = subprocess.run([sys.executable, str(script), worker], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [float(l.split()[-1]) for l in lines[:5]] == _losses(thin_binary, worker)
    assert "client-only build" in lines[5]
    assert lines[6].startswith("cpu op: fill_: a client-only build") and \
        "set_default_device" in lines[6], lines[6]
    assert lines[7].startswith("distributed:") and "client-only build" in lines[7], lines[7]
    thin_c = [f for f in os.listdir(os.path.join(THIN, "python", "kiln")) if f.startswith("_C")][0]
    libs = _closure(os.path.join(THIN, "python", "kiln", thin_c))
    assert not any(re.match(r"lib(dnnl|gomp|ucp|kiln_kernels|kiln_compiler|cuda)", n) for n in libs)
    print(f"thin Python package: {sum(map(os.path.getsize, libs.values())) / 2**20:.1f} MB "
          f"loaded with _C")
