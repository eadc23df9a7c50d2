"""What the numbers were measured on: CPU, threads, BLAS, compiler flags, commit, load."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_name() -> str | None:
    """Name of the first NVIDIA GPU (nvidia-smi, else torch.cuda), None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def label(cpus: int, model: str, gpu: str | None) -> str:
    """Short file-name label of a host: GPU model (if any) and CPU count, e.g. "h100-16cpu",
    "epyc-2cpu" (the first model word with a digit, else the first after the vendor)."""
    def short(name: str, skip: tuple[str, ...]) -> str:
        words = [w for w in _slug(name).split("-") if w and w not in skip]
        return next((w for w in words if any(c.isdigit() for c in w)), words[0] if words else "")

    cpu = short(model, ("intel", "r", "tm", "amd", "cpu", "processor", "core"))
    head = short(gpu, ("nvidia", "tesla")) if gpu else cpu
    return f"{head}-{cpus}cpu" if head else f"{cpus}cpu"


def host() -> dict[str, Any]:
    """What the host is: CPU count and model, GPU name (None without one), a file-name label."""
    cpus, model, gpu = os.cpu_count() or 1, cpu_model(), gpu_name()
    return {"cpu_count": cpus, "cpu_model": model, "gpu": gpu, "label": label(cpus, model, gpu),
            "hostname": socket.gethostname()}


def git_commit() -> dict[str, Any]:
    """HEAD commit and whether the working tree had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


#: The sources a result depends on (kernels, runtime, ABI, bench), hashed by
#: :func:`source_digest`: a results file names the tree it ran on even where the
#: checkout's .git is missing or stale (a working tree copied to another machine).
DIGEST_DIRS = ("capabilities", "runtime", "kernels", "gc", "bench")
DIGEST_SUFFIXES = (".py", ".c", ".h")


def _digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def _digest_path(path: str) -> bool:
    return path.split("/", 1)[0] in DIGEST_DIRS and path.endswith(DIGEST_SUFFIXES) \
        and "/results/" not in path


def source_digest(root: Path = REPO) -> str:
    """Hash of the working tree's sources under DIGEST_DIRS (.py, .c, .h)."""
    files = []
    for d in DIGEST_DIRS:
        for f in (root / d).rglob("*"):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and _digest_path(rel) and "__pycache__" not in rel:
                files.append((rel, f.read_bytes()))
    return _digest(files)


def source_digest_at(rev: str, root: Path = REPO) -> str:
    """:func:`source_digest` of commit ``rev`` (its tracked files), to match a result's
    digest to a commit: ``python -m capqr.bench.machine digest REV``."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    return _digest([(n, subprocess.run(["git", "show", f"{rev}:{n}"], cwd=root, check=True,
                                       capture_output=True).stdout)
                    for n in names if _digest_path(n)])


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the loaded BLAS/OpenMP libraries (after numpy/scipy/torch load)."""
    import numpy  # noqa: F401  (load the libraries threadpoolctl should see)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_info

    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "threading_layer",
            "architecture", "filepath")
    return [{k: d.get(k) for k in keep} for d in threadpool_info()]


def torch_blas() -> dict[str, Any] | None:
    """torch's BLAS/LAPACK (statically linked MKL is invisible to threadpoolctl)."""
    try:
        import torch
    except ImportError:
        return None
    cfg = torch.__config__.show()
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        if f"{key}=" in cfg:
            out[key] = cfg.split(f"{key}=", 1)[1].split(",", 1)[0].strip()
    line = next((ln.strip() for ln in cfg.splitlines() if "Math Kernel Library" in ln), None)
    out["mkl"] = line
    return out


def compiler() -> dict[str, Any]:
    """Kernel compiler identity and flags (identical for checked and raw builds)."""
    from ..runtime.build import compiler_id
    from ..runtime.cpu.kernel import cflags

    return {"cc": compiler_id(), "kernel_cflags": cflags(),
            "CAPQR_CFLAGS": os.environ.get("CAPQR_CFLAGS")}


def threads() -> dict[str, Any]:
    """Threads used by each side: capqr worker pool, torch, and the environment knobs."""
    from .. import runtime

    out: dict[str, Any] = {"capqr_workers": runtime.threads(), "capqr_pinned": runtime.pinned(),
                           "cpu_count": os.cpu_count()}
    try:
        import torch

        out["torch"] = torch.get_num_threads()
    except ImportError:
        out["torch"] = None
    for var in ("CAPQR_THREADS", "CAPQR_PIN", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS"):
        out[var] = os.environ.get(var)
    return out


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages (other processes share the machine)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe() -> dict[str, Any]:
    """Everything above plus host, date, versions, as one JSON-ready dict."""
    import numpy
    import scipy

    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        torch_v = None
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "host": socket.gethostname(),
        "machine": host(),
        "date": now.date().isoformat(),
        "datetime_utc": now.isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__, "scipy": scipy.__version__, "torch": torch_v,
        "threads": threads(),
        "blas": blas_info(),
        "torch_blas": torch_blas(),
        "gc_impl": "gc/ (concurrent collector)",
        "compiler": compiler(),
        "git": git_commit(),
        "source_digest": source_digest(),
        "loadavg_start": loadavg(),
        "concurrent_load": "possible (shared machine: other processes may run during the "
                           "benchmark; interleaved runs spread their effect evenly)",
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m capqr.bench.machine``: the host, or a source digest."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.machine",
                                 description="Print what this host is, or a source digest.")
    ap.add_argument("what", nargs="?", choices=("host", "digest"), default="host",
                    help="host: CPU count and model, GPU, label (default); digest: the "
                         "source digest of the working tree, or of REV")
    ap.add_argument("rev", nargs="?", default=None,
                    help="with digest: a commit whose tracked sources to hash")
    ns = ap.parse_args(argv)
    if ns.what == "digest":
        print(source_digest_at(ns.rev) if ns.rev else source_digest())
    else:
        print(json.dumps(host(), indent=1))


if __name__ == "__main__":
    main()
