"""Where a CPU update's wall-clock time goes, from a sampling profile of a running update (Linux ``perf``).

The reference model is built and warmed up in a fresh process (``bench_updates.trained_model``, the
working tree, compiled with ``--compile``); ``perf record`` then samples that process, every thread,
while it runs ``--updates`` timed updates. Each sample is put in one class by the code it was in
(:func:`classify`): the matrix products (oneDNN's run-time generated kernels, MKL, oneDNN's own
host code), the package's CPU attention kernel (``sb3_amago/nets/cpu_attention.cpp``: the
attention's products and its softmax), the compiled graph's kernels, native kernels (torch's
elementwise ones, norms, copies, the optimizer's, and the package's dropout mask), an OpenMP thread waiting, and host code (the Python interpreter, torch's Python
bindings and dispatcher, the C library's allocations and plain copies). The main thread runs the update
from start to end, so its samples split the update's wall time; the other threads' samples say how
long the OpenMP workers wait while the main thread works alone. The main thread's most sampled
symbols of the host and native classes are listed after the shares (``--top``).

    python benchmarks/profile_update.py --length 64 --compile --threads 2
    python benchmarks/profile_update.py --length 256 --updates 40
    python benchmarks/profile_update.py --compile --preload libtcmalloc_minimal.so.4   # another allocator

"Outside the products" is every class of the main thread but the products, the attention kernel and
the OpenMP wait (the main thread waiting at the end of a parallel region, its share reported beside it).

Results: ``benchmarks/results/profile_update.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from common import REPO, RESULTS_DIR, write_results
from compare_commits import load_average

from sb3_amago.nets import cpu_kernels

#: The classes, in report order.
PRODUCTS = "matrix products"
ATTENTION = "attention kernel"
COMPILED = "compiled graph kernels"
NATIVE = "torch native kernels"
WAIT = "OpenMP wait"
HOST = "host: Python, dispatch, C library"
CLASSES = (PRODUCTS, ATTENTION, COMPILED, NATIVE, WAIT, HOST)
#: The thread groups.
MAIN, WORKERS = "main thread", "OpenMP workers"

#: torch's native kernels, recognised in libtorch_cpu by their symbols.
_NATIVE_KERNEL = re.compile(r"at::native|Sleef_|Vectorized|_kernel|invoke_parallel|copy_same_type")
#: One line of ``perf script -F tid,ip,sym,dso -G``: thread, address, symbol, object.
_SAMPLE = re.compile(r"^\s*(\d+)\s+[0-9a-f]+\s+(.*)\s+\(([^()]*)\)\s*$")  # symbols may hold parentheses

UPDATES = """
import json, sys, time, torch as th
th.set_num_threads(int(sys.argv[1]))
from bench_updates import trained_model
model = trained_model(int(sys.argv[2]), compile_model=sys.argv[4] == "1")
model.train(gradient_steps=10, batch_size=8)
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
model.train(gradient_steps=int(sys.argv[3]), batch_size=8)
print(json.dumps({"update_ms": 1e3 * (time.perf_counter() - start) / int(sys.argv[3])}), flush=True)
sys.stdin.readline()
"""


def classify(symbol: str, dso: str) -> str:
    """The class of a sample whose innermost frame is ``symbol`` in the object ``dso``."""
    name = Path(dso).name
    if re.fullmatch(r"perf-\d+\.map", name):  # code generated at run time: oneDNN's kernels (or Python's perf trampolines)
        return HOST if symbol.startswith("py::") else PRODUCTS
    if symbol.startswith("mkl_") or "dnnl" in symbol or "ideep" in symbol:
        return PRODUCTS
    if name.startswith("libgomp"):
        return WAIT
    if name.startswith(cpu_kernels.BUILD_PREFIX):  # the package's kernels: attention's, or the dropout mask's
        return NATIVE if "dropout" in symbol else ATTENTION
    if name.endswith(".main.so") or "torchinductor" in dso:
        return COMPILED
    if name.startswith("libtorch_cpu") and _NATIVE_KERNEL.search(symbol):
        return NATIVE
    return HOST


def samples(lines: Iterable[str]) -> list[tuple[int, str, str]]:
    """``(thread id, symbol, object)`` of each sample line of ``perf script``; other lines skipped."""
    matches = (_SAMPLE.match(line) for line in lines)
    return [(int(m.group(1)), m.group(2), m.group(3)) for m in matches if m is not None]


def thread_shares(parsed: list[tuple[int, str, str]], main_tid: int) -> dict[str, dict[str, float]]:
    """``{MAIN: {class: share}, WORKERS: {class: share}}`` from :func:`samples`' output, each
    group's shares summing to 1 (``"samples"``: its number of samples)."""
    counts: dict[str, collections.Counter[str]] = {MAIN: collections.Counter(), WORKERS: collections.Counter()}
    for tid, symbol, dso in parsed:
        counts[MAIN if tid == main_tid else WORKERS][classify(symbol, dso)] += 1
    shares: dict[str, dict[str, float]] = {}
    for group, counter in counts.items():
        total = sum(counter.values())
        shares[group] = {name: counter[name] / total if total else 0.0 for name in CLASSES} | {"samples": float(total)}
    return shares


def top_symbols(parsed: list[tuple[int, str, str]], main_tid: int, klass: str, n: int) -> list[tuple[str, float]]:
    """The main thread's ``n`` most sampled symbols of class ``klass``, each as ``"symbol [object]"``
    (long C++ names cut at 100 characters) with its share of the main thread's samples."""
    main = [(symbol, dso) for tid, symbol, dso in parsed if tid == main_tid]
    counter = collections.Counter(
        f"{symbol[:100]} [{Path(dso).name}]" for symbol, dso in main if classify(symbol, dso) == klass
    )
    return [(name, count / len(main)) for name, count in counter.most_common(n)]


def profile(
    threads: int, length: int, updates: int, compile_model: bool, frequency: int, preload: str | None = None
) -> tuple[list[str], int, float]:
    """``perf script``'s lines for the updates of a fresh process, that process's id (its main
    thread's), and its update time (ms); ``preload``: a library preloaded into that process
    (``LD_PRELOAD``), e.g. another allocator."""
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed: apt-get install linux-perf (Debian) or linux-tools-$(uname -r) (Ubuntu)")
    env = {**os.environ, "PYTHONPATH": str(REPO)} | ({"LD_PRELOAD": preload} if preload else {})
    command = [sys.executable, "-c", UPDATES, str(threads), str(length), str(updates), str(int(compile_model))]
    child = subprocess.Popen(
        command, cwd=REPO / "benchmarks", env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    while child.stdout.readline().strip() != "ready":
        if child.poll() is not None:
            raise SystemExit(f"the measured process exited with {child.returncode} before its updates")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        record = subprocess.Popen(
            ["perf", "record", "-F", str(frequency), "-p", str(child.pid), "-o", str(data)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # perf attaches to every thread before the updates start
        child.stdin.write("\n")
        child.stdin.flush()
        update_ms = json.loads(child.stdout.readline())["update_ms"]
        record.send_signal(signal.SIGINT)  # stop sampling before the process exits: its teardown is no update
        _, err = record.communicate()
        child.communicate("\n")
        if not data.exists() or data.stat().st_size == 0:  # perf exits non-zero on the interrupt itself
            raise SystemExit(f"perf record failed (kernel.perf_event_paranoid may forbid it): {err.strip()}")
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso", "-G"], capture_output=True, text=True, check=True
        )
    return script.stdout.splitlines(), child.pid, update_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=200, help="updates sampled")
    parser.add_argument("--frequency", type=int, default=1999, help="samples per second per thread")
    parser.add_argument("--compile", action="store_true", help="the update compiled (compile_model=True)")
    parser.add_argument("--preload", help="a library to preload into the measured process, e.g. libtcmalloc_minimal.so.4")
    parser.add_argument("--top", type=int, default=12, help="symbols listed for the host and native classes")
    parser.add_argument("--name", default="profile_update")
    args = parser.parse_args()
    load = load_average()
    lines, main_tid, update_ms = profile(args.threads, args.length, args.updates, args.compile, args.frequency, args.preload)
    parsed = samples(lines)
    shares = thread_shares(parsed, main_tid)
    main_thread = shares[MAIN]
    figures = {
        "outside_products": {
            "value": round(1.0 - main_thread[PRODUCTS] - main_thread[ATTENTION] - main_thread[WAIT], 4),
            "unit": "share of the main thread's samples (of the update's wall time)",
            "main_thread_openmp_wait": round(main_thread[WAIT], 4),
            "update_ms": round(update_ms, 2),
            "load_average": round(load, 2),
        }
    }
    for group, values in shares.items():
        for name in CLASSES:
            figures[f"{group}: {name}"] = {"value": round(values[name], 4), "unit": f"share of samples ({group})"}
        figures[f"{group}: samples"] = {"value": int(values["samples"]), "unit": "samples"}
    for klass in (HOST, NATIVE):
        for rank, (symbol, share) in enumerate(top_symbols(parsed, main_tid, klass, args.top), 1):
            figures[f"{MAIN}: {klass}, symbol {rank}"] = {
                "value": round(share, 4),
                "unit": "share of samples",
                "symbol": symbol,
            }
    for name, figure in figures.items():
        print(f"{name}: {figure['value']}" + (f"  {figure['symbol']}" if "symbol" in figure else ""))
    config = {
        "threads": args.threads,
        "length": args.length,
        "updates": args.updates,
        "compile_model": args.compile,
        "frequency": args.frequency,
        "preload": args.preload,
        "top": args.top,
    }
    write_results(args.name, config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
