"""What slows the main thread while an early upload runs beside it? (issue 14, cudaload.fastload.early)

Runs 19-20 on the H200: with the checkpoint copied to the GPU on threads during the imports, the import phase
ran a median 1.3 s longer. Fresh-process imports vary too much there (9-16 s) to take apart, so this measures
in one process, alternating, how long a fixed piece of main-thread work takes alone and with one background
activity at a time:

work (main thread):
- ``python``: pure bytecode (the interpreter loop, as executing module bodies is): contention for the GIL;
- ``mmap``: map a 256 MB file, touch every page, unmap (as loading extension modules does): contention for the
  process's memory map and page tables.

background (threads, looping until the work is done):
- ``none``; ``upload``: cudaload's EarlyUpload of the checkpoint (what load_model runs), discarded, again;
- ``alloc``: only the GPU allocations the upload makes (one ``torch.empty`` per tensor, then freed and
  ``empty_cache``);
- ``pin``: only the pinned staging pool (``cudaHostRegister`` / unregister of 6 x 64 MiB); ``pin_torch``: the
  same through torch's pinned allocator;
- ``read``: only the reads (``preadv`` of the files from the page cache, 4 threads x 64 MiB, as the upload
  reads; ``read4x16M``, ``read2x256M``, ``read1x256M``: other thread counts and read sizes; ``read_process``:
  ``read``'s reads in a child process, which shares no GIL with the main thread);
- ``h2d``: only copies from one pinned buffer to the GPU.

    python benchmarks/bench_upload_contention.py --out DIR --shape Qwen3-8B --reps 5 --budget-s 200
    python benchmarks/bench_upload_contention.py --out DIR --smoke      # CPU: python/mmap x none/read
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))


def work_python(n: int) -> None:
    total = 0
    for i in range(n):
        total += (i * 7) % 13
    if total < 0:
        raise AssertionError


def work_mmap(path: str, rounds: int) -> None:
    import mmap

    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        for _ in range(rounds):
            m = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
            s = 0
            for off in range(0, size, mmap.PAGESIZE):
                s += m[off]
            m.close()


class Background:
    """Run ``step`` in ``threads`` threads until stopped; counts steps."""

    def __init__(self, step: Callable[[], None], threads: int = 1) -> None:
        self.step, self.stop, self.steps, self.error = step, threading.Event(), 0, None
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.steps += 1
        except Exception as e:  # reported in the results
            self.error = f"{type(e).__name__}: {e}"

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


#: A child process doing ``read``'s reads (4 threads x 64 MiB ``preadv``, looping): no GIL shared with the main
#: thread. If the main thread slows beside it as beside ``read``, the cost is the machine's (memory bandwidth,
#: caches, the kernel), not the GIL's.
READ_CHILD = r"""
import os, sys, threading
files = sys.argv[1:]
def loop():
    view = memoryview(bytearray(64 << 20))
    while True:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            off = 0
            while os.preadv(fd, [view], off) > 0:
                off += len(view)
            os.close(fd)
ts = [threading.Thread(target=loop, daemon=True) for _ in range(4)]
for t in ts: t.start()
print("ready", flush=True)
sys.stdin.read()
"""


class ProcessBackground:
    """``READ_CHILD`` in a child process until ended (its steps are not counted)."""

    def __init__(self, files: list[str]) -> None:
        import subprocess

        self.steps, self.error = None, None
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READ_CHILD, *files],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # "ready": the readers run

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()


def backgrounds(
    files: list[str], smoke: bool
) -> dict[str, Callable[[], Background | ProcessBackground | None]]:
    from cudaload.fastload.reader import read_file_header

    infos = [i for f in files for i in read_file_header(f)[0].values()]

    def read_step(size: int) -> Callable[[], None]:
        def step() -> None:
            buf = bytearray(size)
            view = memoryview(buf)
            for f in files:
                fd = os.open(f, os.O_RDONLY)
                try:
                    off = 0
                    while os.preadv(fd, [view], off) > 0:
                        off += len(buf)
                finally:
                    os.close(fd)

        return step

    out: dict[str, Callable[[], Background | ProcessBackground | None]] = {
        "none": lambda: None,
        # threads x read size: if the main thread's loss follows the number of reads per second (each read
        # returns to Python and asks for the GIL), it is the GIL's hand-over; if not, memory bandwidth
        "read": lambda: Background(read_step(64 << 20), threads=4),
        "read4x16M": lambda: Background(read_step(16 << 20), threads=4),
        "read2x256M": lambda: Background(read_step(256 << 20), threads=2),
        "read1x256M": lambda: Background(read_step(256 << 20), threads=1),
        "read_process": lambda: ProcessBackground(files),
    }
    if smoke:
        return out
    import torch

    from cudaload.fastload import early, staging
    from cudaload.fastload.materialize import torch_dtype

    def upload_step() -> None:
        up = early.EarlyUpload(infos, "cuda:0")
        up._thread.join()
        up.discard("benchmark")

    def alloc_step() -> None:
        ts = [torch.empty(i.shape, dtype=torch_dtype(i.dtype), device="cuda:0") for i in infos]
        torch.cuda.synchronize()
        del ts
        torch.cuda.empty_cache()

    def pin_step(register: bool) -> Callable[[], None]:
        def step() -> None:
            pool = staging.PinnedPool(6, 64 << 20, device=torch.device("cuda:0"), register=register)
            for _ in range(6):
                pool.put(pool.get())
            pool.close()

        return step

    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")

    def h2d_step() -> None:
        for _ in range(16):
            dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    out.update(
        upload=lambda: Background(upload_step),
        alloc=lambda: Background(alloc_step),
        pin=lambda: Background(pin_step(True)),
        pin_torch=lambda: Background(pin_step(False)),
        h2d=lambda: Background(h2d_step),
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="Qwen3-8B")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "ckpt"
    if args.smoke:
        from cudaload.testing.models import make_tiny

        if not (ckpt / "config.json").exists():
            make_tiny("qwen3", ckpt, dtype="bfloat16")
    else:
        from bench_fresh import write_checkpoint

        write_checkpoint(args.shape, ckpt, "cuda:0")
        import torch

        torch.cuda.init()
        torch.ones(1, device="cuda:0")  # the context exists before any window
    files = sorted(str(p) for p in ckpt.glob("*.safetensors"))
    for f in files:  # warm: the reads below come from the page cache, as in runs 19-20
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    mfile = str(out / "mmap.bin")
    with open(mfile, "wb") as fh:
        fh.write(os.urandom(1 << 20) * (16 if args.smoke else 256))
    works: dict[str, Callable[[], None]] = {
        "python": lambda: work_python(2_000_000 if args.smoke else 20_000_000),
        "mmap": lambda: work_mmap(mfile, 2 if args.smoke else 24),
    }
    bgs = backgrounds(files, args.smoke)
    samples: list[dict[str, Any]] = []
    reps = 1 if args.smoke else args.reps
    for rep in range(reps):
        for wname, work in works.items():
            for bname, make in bgs.items():
                if time.perf_counter() - t_start > args.budget_s:
                    break
                bg = make()
                time.sleep(0.2 if bg is not None else 0)  # the background is running before the work starts
                t0 = time.perf_counter()
                work()
                dt = time.perf_counter() - t0
                if bg is not None:
                    bg.end()
                samples.append(
                    {
                        "rep": rep,
                        "work": wname,
                        "background": bname,
                        "seconds": round(dt, 4),
                        "bg_steps": bg.steps if bg else None,
                        "bg_error": bg.error if bg else None,
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
    rows = []
    for wname in works:
        alone = [s["seconds"] for s in samples if s["work"] == wname and s["background"] == "none"]
        for bname in bgs:
            got = [s["seconds"] for s in samples if s["work"] == wname and s["background"] == bname]
            if got and alone:
                med = statistics.median(got)
                rows.append(
                    {
                        "work": wname,
                        "background": bname,
                        "n": len(got),
                        "median_s": round(med, 4),
                        "min_s": min(got),
                        "max_s": max(got),
                        "vs_alone": round(med / statistics.median(alone), 3),
                    }
                )
    (out / "contention.json").write_text(json.dumps({"samples": samples, "rows": rows}, indent=1))
    md = ["| work | background | n | median s (min-max) | vs alone |", "|---|---|---|---|---|"]
    md += [
        f"| {r['work']} | {r['background']} | {r['n']} | {r['median_s']} ({r['min_s']}-{r['max_s']}) | "
        f"{r['vs_alone']} |"
        for r in rows
    ]
    (out / "contention.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
