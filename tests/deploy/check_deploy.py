#!/usr/bin/env python3
"""Checks deploy/ (the operators' files: deploy/README.md) without a cluster, a container
engine or Slurm. Run by ctest (Deploy.ManifestsAndUnitsValidate):

    .venv/bin/python tests/deploy/check_deploy.py [--bin-dir build/bin]

- Kubernetes: every document of deploy/k8s/*.yaml validates strictly (an unknown field is an
  error) against the Kubernetes 1.30 JSON schemas that the `kubernetes-validate` package bundles
  (offline; scripts/bootstrap installs it). A kind it has no schema for fails: no CRD without a
  schema. Then what the schemas cannot see: the daemons get only flags their --help lists, probe
  grpc.health.v1 on the port they listen on, take their tokens from one Secret, and the workers'
  --coordinator names a Service port of the manifests.
- systemd: `systemd-analyze verify` on each unit, and no line it prints may name one of ours.
  It checks that ExecStart's program exists, so the units are verified as copies in a temporary
  folder with /usr/local/bin/ rewritten to --bin-dir (the built binaries); the template is
  verified as an instance. ExecStart's flags must be in the daemon's --help.
- Slurm: `bash -n`, and shellcheck where it is installed; the daemons' flags as above.
- Containerfile: every stage is FROM debian:12 (or -slim), and the runtime (last) stage installs
  no -dev package and no toolchain, but every Debian package whose libraries `ldd` lists for
  the built binaries (mapped with `dpkg -S`).

Prints one line per problem and exits 1 if there is any; exits 77 (ctest: skipped) only when
systemd-analyze is absent (a machine without systemd).
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

KUBERNETES_VERSION = "1.30"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
DAEMONS = ("kiln-coordinator", "kiln-worker")
BINARIES = DAEMONS + ("kiln",)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# Packages every Debian 12 image has (Essential or required by apt itself).
BASE_PACKAGES = {"libc6", "libgcc-s1"}
TOOLCHAIN = {"build-essential", "cmake", "ninja-build", "gcc", "g++", "clang", "ccache"}

problems = []


def problem(msg):
    problems.append(msg)
    print(f"FAIL {msg}")


def rel(path):
    return os.path.relpath(path, REPO)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def help_flags(bin_dir):
    """Each daemon's flags, as its --help lists them."""
    flags = {}
    for name in DAEMONS:
        out = run([os.path.join(bin_dir, name), "--help"])
        flags[name] = set(re.findall(r"(--[a-z][a-z-]*)", out.stdout))
        if out.returncode != 0 or not flags[name]:
            problem(f"{name} --help failed (exit {out.returncode}): {out.stderr.strip()}")
    return flags


def check_flags(where, program, args, flags):
    for a in args:
        if a.startswith("--") and a.split("=")[0] not in flags[program]:
            problem(f"{where}: {program} has no flag {a.split('=')[0]} (see {program} --help)")


# --- Kubernetes ---------------------------------------------------------------------------------


def load_manifests():
    import yaml
    docs = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "k8s", "*.y*ml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((rel(path), doc))
    return docs


def check_schemas(docs):
    import kubernetes_validate
    from kubernetes_validate import SchemaNotFoundError, ValidationError
    for path, doc in docs:
        name = f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            problem(f"{name}: not valid Kubernetes {KUBERNETES_VERSION}: {where}: {e.message}")
        except SchemaNotFoundError as e:
            problem(f"{name}: {e.message} (check in its schema and validate against it)")
        except Exception as e:  # a document without apiVersion or kind, an unreadable schema
            problem(f"{name}: cannot be validated: {e!r}")


def pod_specs(docs):
    for path, doc in docs:
        spec = (doc.get("spec") or {}).get("template", {}).get("spec")
        if spec:
            yield f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}", spec


def secret_env(container):
    """{env name: (secret, key)} for the container's env taken from a Secret."""
    out = {}
    for e in container.get("env", []):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            out[e["name"]] = (ref.get("name"), ref.get("key"))
    return out


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def check_pods(docs, flags):
    services = {(d.get("metadata", {}).get("name"), p.get("port")) for _, d in docs
                if d.get("kind") == "Service" for p in d.get("spec", {}).get("ports", [])}
    worker_tokens = {}  # program -> (secret, key) of the worker token
    seen = set()
    for name, spec in pod_specs(docs):
        secret_volumes = {v["name"] for v in spec.get("volumes", []) if "secret" in v}
        for c in spec.get("containers", []):
            program = os.path.basename((c.get("command") or [""])[0])
            if program not in DAEMONS:
                continue
            seen.add(program)
            where = f"{name} container {c.get('name')}"
            args = [str(a) for a in c.get("args", [])]
            check_flags(where, program, args, flags)
            listen = flag_value(args, "--listen") or ""
            port = listen.rsplit(":", 1)[-1]
            for probe in ("readinessProbe", "livenessProbe"):
                grpc = (c.get(probe) or {}).get("grpc")
                if not grpc or str(grpc.get("port")) != port:
                    problem(f"{where}: {probe} must be a grpc probe of the --listen port ({port})")
            env = secret_env(c)
            if listen.rsplit(":", 1)[0] in LOOPBACK:
                continue
            # Beyond loopback a daemon needs a token (README "The coordinator and workers").
            token_env = "KILN_WORKER_TOKEN" if program == "kiln-coordinator" else "KILN_TOKEN"
            if token_env not in env:
                problem(f"{where}: listens on {listen} without {token_env} from a Secret")
            else:
                worker_tokens[program] = env[token_env]
            if program == "kiln-coordinator":
                tokens = flag_value(args, "--tokens")
                mounts = [m for m in c.get("volumeMounts", []) if m["name"] in secret_volumes]
                if not tokens or not any(tokens.startswith(m["mountPath"] + "/") for m in mounts):
                    problem(f"{where}: --tokens must be a file of a Secret volume")
            else:
                coord = flag_value(args, "--coordinator") or ""
                host, _, cport = coord.rpartition(":")
                if not cport.isdigit() or (host.split(".")[0], int(cport)) not in services:
                    problem(f"{where}: --coordinator {coord} is no Service port of deploy/k8s")
    for program in DAEMONS:
        if program not in seen:
            problem(f"deploy/k8s runs no {program}")
    if len(set(worker_tokens.values())) > 1:
        problem(f"deploy/k8s: the coordinator and the workers differ on the worker token: "
                f"{worker_tokens}")


# --- systemd ------------------------------------------------------------------------------------


def exec_start(path):
    """ExecStart's words, continuation lines joined."""
    with open(path) as f:
        for line in f.read().replace("\\\n", " ").splitlines():
            if line.startswith("ExecStart="):
                return shlex.split(line[len("ExecStart="):])
    return []


def check_units(bin_dir, flags):
    units = sorted(glob.glob(os.path.join(DEPLOY, "systemd", "*.service")))
    if not units:
        problem("deploy/systemd has no units")
    tmp = tempfile.mkdtemp(prefix="kiln-units-")
    try:
        to_verify = []
        for unit in units:
            base = os.path.basename(unit)
            with open(unit) as f:
                text = f.read()
            for key in ("Restart=on-failure", "KillSignal=SIGTERM", "TimeoutStopSec="):
                if not re.search(rf"^{re.escape(key)}", text, re.M):
                    problem(f"{rel(unit)}: no {key}")
            argv = exec_start(unit)
            program = os.path.basename(argv[0]) if argv else ""
            if not argv or argv[0] != f"/usr/local/bin/{program}" or program not in DAEMONS:
                problem(f"{rel(unit)}: ExecStart must run /usr/local/bin/kiln-coordinator or "
                        "/usr/local/bin/kiln-worker")
            else:
                check_flags(rel(unit), program, argv[1:], flags)
            copy = text.replace("/usr/local/bin/", os.path.abspath(bin_dir) + "/")
            # A template verifies only as an instance (kiln-worker@.service -> @7071).
            names = [base.replace("@.", "@7071.")] if "@." in base else [base]
            for n in names:
                with open(os.path.join(tmp, n), "w") as f:
                    f.write(copy)
                to_verify.append(n)
        out = run(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no"]
                  + [os.path.join(tmp, n) for n in to_verify], cwd=tmp)
        ours = to_verify + [os.path.basename(u) for u in units] + [tmp]
        for line in (out.stdout + out.stderr).splitlines():
            if any(o in line for o in ours):
                problem(f"systemd-analyze verify: {line.replace(tmp + '/', 'deploy/systemd/')}")
            elif line.strip():
                print(f"note (not about deploy/systemd): {line}")
        if out.returncode != 0:
            problem(f"systemd-analyze verify exited {out.returncode}")
    finally:
        shutil.rmtree(tmp)


# --- Slurm --------------------------------------------------------------------------------------


def check_slurm(flags):
    script = os.path.join(DEPLOY, "slurm", "kiln.sbatch")
    if not os.path.exists(script):
        problem("deploy/slurm/kiln.sbatch is missing")
        return
    out = run(["bash", "-n", script])
    if out.returncode != 0:
        problem(f"bash -n {rel(script)}: {out.stderr.strip()}")
    if shutil.which("shellcheck"):
        out = run(["shellcheck", script])
        if out.returncode != 0:
            problem(f"shellcheck {rel(script)}:\n{out.stdout.strip()}")
    else:
        print("note: shellcheck is not installed; ran bash -n only")
    with open(script) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    started = set()
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        for program in DAEMONS:
            m = re.search(rf'/{program}"?\s(.*)$', line)
            if m:
                started.add(program)
                args = shlex.split(m.group(1).split("&")[0])
                check_flags(rel(script), program, args, flags)
    for program in DAEMONS:
        if program not in started:
            problem(f"{rel(script)} starts no {program}")


# --- Containerfile ------------------------------------------------------------------------------


def containerfile_stages(path):
    """[(image, [(instruction, text)])] with continuation lines joined and comments dropped."""
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    stages = []
    for line in text.splitlines():
        if not line.strip():
            continue
        instr, _, rest = line.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            stages.append((words[0] if words else "", []))
        elif stages:
            stages[-1][1].append((instr, rest))
        else:
            problem(f"{rel(path)}: {instr} before the first FROM")
    return stages


def needed_packages(bin_dir):
    """The Debian packages of the libraries that ldd lists for the built binaries (Kiln's own
    libraries and /usr/local ones, such as CUDA's, left out)."""
    libs = set()
    for name in BINARIES + ("kiln-plan",):
        path = os.path.join(bin_dir, name)
        if not os.path.exists(path):
            continue
        out = run(["ldd", path])
        for m in re.finditer(r"=>\s+(/\S+)", out.stdout):
            lib = m.group(1)
            if lib.startswith("/usr/local/") or os.path.basename(lib).startswith("libkiln_"):
                continue
            libs.add(lib)
        for m in re.finditer(r"^\s*(\S+) => not found", out.stdout, re.M):
            problem(f"ldd {name}: {m.group(1)} not found")
    # dpkg knows a library by the path its package installed (often /usr/lib, where ldd may
    # name /lib, and the versioned file rather than the soname link): ask for all of them.
    candidates = sorted(libs | {os.path.realpath(lib) for lib in libs}
                        | {"/usr" + lib for lib in libs if lib.startswith("/lib/")})
    out = run(["dpkg", "-S"] + candidates)
    owner = {}
    for line in out.stdout.splitlines():
        pkgs, _, file = line.partition(": ")
        for pkg in pkgs.split(", "):
            owner[file] = pkg.split(":")[0]
    packages = set()
    for lib in sorted(libs):
        real = os.path.realpath(lib)
        forms = (lib, real, "/usr" + lib, "/usr" + real)
        found = [owner[f] for f in forms if f in owner]
        if found:
            packages.add(found[0])
        else:
            problem(f"ldd lists {lib}, which no Debian package owns")
    return packages


def check_containerfile(bin_dir):
    path = os.path.join(DEPLOY, "Containerfile")
    stages = containerfile_stages(path)
    if len(stages) < 2:
        problem(f"{rel(path)}: needs a build stage and a runtime stage")
        return
    for image, _ in stages:
        if not re.fullmatch(r"debian:(12|bookworm)(\.\d+)*(-slim)?(@sha256:[0-9a-f]{64})?", image):
            problem(f"{rel(path)}: stage FROM {image}, not debian:12")
    runtime = stages[-1][1]
    installed = set()
    for instr, text in runtime:
        if instr != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", text):
            words = shlex.split(cmd)
            if "install" in words and any(w.endswith("apt-get") or w == "apt" for w in words):
                after = words[words.index("install") + 1:]
                installed |= {w.split("=")[0].split(":")[0] for w in after if not w.startswith("-")}
    for p in sorted(installed):
        if p.endswith("-dev") or p in TOOLCHAIN:
            problem(f"{rel(path)}: the runtime stage installs {p}")
    users = [text.split(":")[0].strip() for instr, text in runtime if instr == "USER"]
    if not users or users[-1] in ("root", "0"):
        problem(f"{rel(path)}: the runtime stage must run as a non-root USER")
    if not any(instr == "EXPOSE" for instr, _ in runtime):
        problem(f"{rel(path)}: the runtime stage exposes no port")
    missing = needed_packages(bin_dir) - installed - BASE_PACKAGES
    for p in sorted(missing):
        problem(f"{rel(path)}: the runtime stage lacks {p} (ldd of the built binaries needs it)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"),
                    help="where kiln-coordinator, kiln-worker and kiln were built")
    args = ap.parse_args()
    if not shutil.which("systemd-analyze"):
        print("skipped: systemd-analyze is not installed (no systemd on this machine)")
        return 77
    for name in BINARIES:
        if not os.access(os.path.join(args.bin_dir, name), os.X_OK):
            print(f"FAIL {name} is not built in {args.bin_dir} (scripts/build)")
            return 1
    try:
        import kubernetes_validate  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        print(f"FAIL {e}: scripts/bootstrap installs kubernetes-validate into .venv")
        return 1

    flags = help_flags(args.bin_dir)
    docs = load_manifests()
    if not docs:
        problem("deploy/k8s has no manifests")
    check_schemas(docs)
    check_pods(docs, flags)
    check_units(args.bin_dir, flags)
    check_slurm(flags)
    check_containerfile(args.bin_dir)
    if problems:
        print(f"{len(problems)} problem(s) in deploy/")
        return 1
    print(f"deploy/: {len(docs)} Kubernetes {KUBERNETES_VERSION} documents, the systemd units, "
          "the Slurm script and the Containerfile check out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
