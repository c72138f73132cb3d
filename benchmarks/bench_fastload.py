"""Load-time benchmark: cudaload.fastload.load against from_pretrained, measured in the same run.

    python benchmarks/bench_fastload.py --out benchmarks/results/fastload-h200   # GPU, Qwen3 0.6B and 8B shapes
    python benchmarks/bench_fastload.py --small --out /tmp/bench                 # CPU/CI, tiny shapes

For each shape it writes a random bf16 checkpoint (generated on the GPU, saved as safetensors shards under
--work), then times warm loads alternating from_pretrained / fastload (--reps each, median), cold loads (the
checkpoint's files evicted from the page cache, see pagecache.py; no root needed), the raw bound (the same files
read into pinned buffers and copied to one flat GPU buffer, no model) and the disk's sequential read rate.
Every load runs in its own subprocess so host memory peaks (``VmHWM``) are separate; the GPU peak is
``torch.cuda.max_memory_allocated``. A fingerprint of the loaded weights is compared between the two loaders
so a fast but wrong load cannot pass. Writes ``fastload.json`` and ``fastload.md`` into --out.

    python benchmarks/bench_fastload.py --sweep --out DIR   # staging parameters: threads x buffer size

``--sweep`` times, in one process per shape, the pinning of staging pools and the raw read+copy pipeline for
each (threads, buffer size, pinning method), and fastload's phases per buffer size: the data behind the
defaults in cudaload/fastload/staging.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"full": ["Qwen3-0.6B", "Qwen3-8B"], "small": ["tiny-a", "tiny-b"]}
SMALL_CONFIGS: dict[str, dict[str, Any]] = {
    # same family and layout as the full shapes, a few MB each
    "tiny-a": {
        "vocab_size": 4096,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
    },
    "tiny-b": {
        "vocab_size": 8192,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "tie_word_embeddings": False,
    },
}


def _config(shape: str) -> Any:
    import transformers

    if shape in SMALL_CONFIGS:
        return transformers.Qwen3Config(
            **SMALL_CONFIGS[shape], dtype="bfloat16", architectures=["Qwen3ForCausalLM"]
        )
    sys.path.insert(0, str(ROOT / "src"))
    from cudaload.testing import full_config

    return full_config(shape)


def make_checkpoint(shape: str, path: Path, device: str, shard_bytes: int) -> dict[str, Any]:
    """Random bf16 weights for ``shape`` in safetensors shards, generated on ``device`` one tensor at a time."""
    import torch
    import transformers
    from safetensors.torch import save_file

    if (path / "config.json").is_file() and (
        (path / "model.safetensors.index.json").is_file() or (path / "model.safetensors").is_file()
    ):
        return {"reused": True}
    t0 = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    config = _config(shape)
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tied = set(getattr(skeleton, "all_tied_weights_keys", {}) or {})
    names = [(k, v) for k, v in skeleton.state_dict().items() if k not in tied]
    gen = torch.Generator(device=device).manual_seed(0)
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, meta in names:
        nbytes = meta.numel() * 2
        if size and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        t = torch.randn(meta.shape, generator=gen, device=device, dtype=torch.float32).mul_(0.02)
        shards[-1][name] = t.to(torch.bfloat16).cpu()
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / fname), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    shards.clear()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(path)  # written last: its presence means the checkpoint is complete
    return {"reused": False, "seconds": round(time.perf_counter() - t0, 2), "bytes": total}


# ---- one measurement per subprocess -------------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    return _status_bytes("VmRSS")


def _fingerprint(model: Any) -> float:
    import torch

    with torch.no_grad():
        params = list(model.parameters())
        picks = params[:3] + params[-3:]
        return float(sum(p.detach().float().flatten()[:4096].double().sum().item() for p in picks))


def measure(
    method: str, path: str, device: str, dtype: str, threads: int | None, buffer_bytes: int | None
) -> dict[str, Any]:
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "src"))
    from cudaload import fastload

    dt = getattr(torch, dtype)
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # CUDA context outside the timed part, as in any real program
        torch.cuda.reset_peak_memory_stats(device)
    # import the model's modeling code outside the timed part (both loaders would pay it once per process)
    config = transformers.AutoConfig.from_pretrained(path)
    _ = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    import transformers.conversion_mapping

    rss_before = _rss_bytes()
    t0 = time.perf_counter()
    if method == "from_pretrained":
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dt, device_map=device)
    elif method == "fastload":
        model = fastload.load(path, device=device, dtype=dt, threads=threads, buffer_bytes=buffer_bytes)
    else:
        raise SystemExit(f"unknown method {method}")
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {
        "method": method,
        "seconds": seconds,
        "rss_before": rss_before,
        # VmHWM, not getrusage's ru_maxrss: a child started by fork+exec inherits its parent's ru_maxrss (the
        # H200 run reported the orchestrator's 16 GiB for both loaders); VmHWM belongs to this process image.
        "rss_peak": _status_bytes("VmHWM"),
    }
    if device.startswith("cuda"):
        # read before the fingerprint, whose float copies would otherwise count as the loader's peak
        out["gpu_peak"] = torch.cuda.max_memory_allocated(device)
        out["gpu_final"] = torch.cuda.memory_allocated(device)
    phases = getattr(model, "cudaload_fastload", None)
    if phases:
        out["phases"] = {k: v for k, v in phases.items() if not k.endswith("_keys")}
    out["fingerprint"] = _fingerprint(model)
    return out


def _flat_targets(path: str, device: str) -> tuple[list[Any], list[Any], Any]:
    """Every tensor of the checkpoint as raw bytes, each aimed at its slice of one flat device buffer: what the
    staging code moves when no model is involved. Returns (infos, targets, flat)."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from cudaload.fastload import read_header, staging
    from cudaload.fastload.reader import TensorInfo

    infos = [
        TensorInfo(f"t{i}", "U8", (t.nbytes,), t.file, t.start, t.end)
        for i, t in enumerate(read_header(path).in_file_order())
    ]
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # CUDA context outside any timed part
    flat = torch.empty(sum(i.nbytes for i in infos), dtype=torch.uint8, device=device)
    targets, off = [], 0
    for info in infos:
        targets.append(staging.Target(info.name, flat[off : off + info.nbytes], torch.uint8))
        off += info.nbytes
    return infos, targets, flat


def raw_bound(path: str, device: str, threads: int | None, buffer_bytes: int | None) -> dict[str, Any]:
    """The same files through the same staging code into one flat device buffer: the ceiling for fastload."""
    import torch

    infos, targets, flat = _flat_targets(path, device)  # puts src/ on sys.path

    from cudaload.fastload import staging

    t0 = time.perf_counter()
    th = threads or staging.default_threads()
    bb = buffer_bytes or staging.DEFAULT_BUFFER_BYTES
    if device.startswith("cuda"):
        staging.fill_cuda(targets, infos, device=torch.device(device), threads=th, buffer_bytes=bb)
        torch.cuda.synchronize(device)
    else:
        staging.fill_cpu(targets, infos, threads=th, buffer_bytes=bb)
    return {"seconds": time.perf_counter() - t0, "bytes": flat.numel()}


def _child(args: list[str], timeout: float = 400) -> dict[str, Any]:
    cmd = [sys.executable, __file__, *args]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ---- page cache ------------------------------------------------------------------------------------------


def _pagecache() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pagecache

    return pagecache


def evict(path: Path) -> dict[str, Any]:
    """Drop the checkpoint's files from the page cache; say how, and how much of them is still cached."""
    pc = _pagecache()
    ok, how = pc.evict(_files(path))
    return {"ok": ok, "how": how, "resident_after": pc.resident_fraction(_files(path))}


def _files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def warm_cache(path: Path) -> None:
    for f in _files(path):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def sequential_read(path: Path) -> dict[str, Any]:
    """One reader, 16 MiB blocks, file after file: the disk's (or page cache's) sequential rate."""
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    n = 0
    t0 = time.perf_counter()
    for f in _files(path):
        with open(f, "rb", buffering=0) as fh:
            while True:
                got = fh.readinto(view)
                if not got:
                    break
                n += got
    s = time.perf_counter() - t0
    return {"seconds": s, "bytes": n, "gb_per_s": n / s / 1e9}


# ---- staging parameter sweep (one process per shape) ------------------------------------------------------


def _host_empty_cache() -> None:
    import torch

    fn = getattr(torch._C, "_host_emptyCache", None) or getattr(
        getattr(torch, "accelerator", None), "empty_host_cache", None
    )
    if fn is not None:
        fn()


def sweep_worker(path: str, device: str, reps: int) -> dict[str, Any]:
    """Pinning cost, raw pipeline rate and fastload phases for each staging configuration, in this process."""
    import gc

    import torch

    dev = torch.device(device)
    infos, targets, flat = _flat_targets(path, device)
    total = flat.numel()

    from cudaload import fastload
    from cudaload.fastload import staging

    out: dict[str, Any] = {"bytes": total, "pin": [], "raw": [], "fastload": []}
    mib = [4, 8, 16, 32, 64]
    for m in mib:  # pinning alone: 18 buffers, both methods
        for register in (True, False):
            pool = staging.PinnedPool(18, m << 20, register=register)
            pool._thread.join()
            out["pin"].append({"mib": m, "count": 18, "register": pool.register, "seconds": pool.pin_seconds})
            pool.close()
            _host_empty_cache()
    configs = [(t, m, True) for t in (8, 16) for m in mib] + [(16, 16, False), (16, 64, False)]
    for threads, m, register in configs:
        for prepinned in (False, True):
            times = []
            for _ in range(reps):
                bb = m << 20
                pool = staging.PinnedPool(staging.pool_size(total, threads, bb), bb, register=register)
                if prepinned:
                    pool._thread.join()
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                staging.fill_cuda(targets, infos, device=dev, threads=threads, buffer_bytes=bb, pool=pool)
                torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
                _host_empty_cache()
            out["raw"].append(
                {
                    "threads": threads,
                    "mib": m,
                    "register": register,
                    "prepinned": prepinned,
                    "seconds": min(times),
                    "all": [round(x, 4) for x in times],
                    "gb_per_s": total / min(times) / 1e9,
                }
            )
            print(json.dumps(out["raw"][-1]), file=sys.stderr, flush=True)
    del flat, targets
    torch.cuda.empty_cache()
    # fastload phases per buffer size (first a throwaway load: module imports and first-call costs)
    for m in [None, *mib]:
        model = fastload.load(path, device=dev, dtype=torch.bfloat16, buffer_bytes=(m << 20) if m else None)
        torch.cuda.synchronize(dev)
        ph = {k: v for k, v in model.cudaload_fastload.items() if not k.endswith("_keys")}
        if m is not None:
            out["fastload"].append({"mib": m, **ph})
            print(json.dumps(out["fastload"][-1]), file=sys.stderr, flush=True)
        del model
        gc.collect()
        torch.cuda.empty_cache()
        _host_empty_cache()
    return out


def sweep_markdown(report: dict[str, Any]) -> str:
    lines = [f"# fastload staging sweep ({report['machine']['date']})", ""]
    for r in report["shapes"]:
        gb = r["bytes"] / 1e9
        lines += [
            f"## {r['shape']} ({gb:.2f} GB, page cache warm)",
            "",
            "Pinning 18 buffers:",
            "",
            "| MiB each | cudaHostRegister s | torch pin_memory s |",
            "|---|---|---|",
        ]
        for m in sorted({p["mib"] for p in r["pin"]}):
            reg = [p["seconds"] for p in r["pin"] if p["mib"] == m and p["register"]]
            tor = [p["seconds"] for p in r["pin"] if p["mib"] == m and not p["register"]]
            lines.append(f"| {m} | {reg[0] if reg else '-':.3} | {tor[0] if tor else '-':.3} |")
        lines += [
            "",
            "Raw read+copy into one GPU buffer (s, best of reps):",
            "",
            "| threads | MiB | pinning | pin in timing | prepinned | GB/s prepinned |",
            "|---|---|---|---|---|---|",
        ]
        for x in r["raw"]:
            if x["prepinned"]:
                continue
            pre = next(
                y
                for y in r["raw"]
                if y["prepinned"]
                and y["threads"] == x["threads"]
                and y["mib"] == x["mib"]
                and y["register"] == x["register"]
            )
            lines.append(
                f"| {x['threads']} | {x['mib']} | {'register' if x['register'] else 'torch'} | "
                f"{x['seconds']:.3f} | {pre['seconds']:.3f} | {pre['gb_per_s']:.1f} |"
            )
        lines += [
            "",
            "fastload.load phases (s), default threads:",
            "",
            "| MiB | total | build | alloc | fill | finish | pin | first wait |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f in r["fastload"]:
            lines.append(
                f"| {f['mib']} | {f['seconds']} | {f['build_s']} | {f['alloc_s']} | {f['fill_s']} | "
                f"{f['finish_s']} | {f.get('pin_s')} | {f.get('wait_s')} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---- driver ----------------------------------------------------------------------------------------------


def bench_shape(shape: str, args: argparse.Namespace, cold_ok: bool) -> dict[str, Any]:
    path = Path(args.work) / shape
    gen = make_checkpoint(
        shape, path, args.device if args.device.startswith("cuda") else "cpu", shard_bytes=args.shard_bytes
    )
    common = ["--path", str(path), "--device", args.device, "--dtype", "bfloat16"]
    if args.threads:
        common += ["--threads", str(args.threads)]
    if args.buffer_bytes:
        common += ["--buffer-bytes", str(args.buffer_bytes)]
    res: dict[str, Any] = {"shape": shape, "checkpoint": gen}
    ckpt_bytes = sum(f.stat().st_size for f in _files(path))
    res["checkpoint_bytes"] = ckpt_bytes
    warm_cache(path)
    runs: dict[str, list[dict[str, Any]]] = {"from_pretrained": [], "fastload": []}
    for _ in range(args.reps):  # alternating, so drift hits both alike
        for method in runs:
            runs[method].append(_child(["--measure", method, *common]))
    res["warm"] = {m: _summary(r) for m, r in runs.items()}
    fps = {r["fingerprint"] for rs in runs.values() for r in rs}
    res["weights_match"] = len(fps) == 1
    res["raw_bound"] = _child(["--bound", *common])
    res["page_cache_read"] = sequential_read(path)
    if cold_ok:
        cold: dict[str, Any] = {}
        evictions = []
        for method in runs:
            evictions.append(evict(path))
            cold[method] = _summary([_child(["--measure", method, *common])])
        evictions.append(evict(path))
        res["disk_read"] = sequential_read(path)
        res["cold"] = cold
        res["evictions"] = evictions
    return res


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "all_seconds": [round(r["seconds"], 4) for r in runs],
        "rss_peak": max(r["rss_peak"] for r in runs),
        "rss_before": min(r["rss_before"] for r in runs),
    }
    if "phases" in runs[-1]:
        out["phases"] = runs[-1]["phases"]
    if "gpu_peak" in runs[0]:
        out["gpu_peak"] = max(r["gpu_peak"] for r in runs)
        out["gpu_final"] = max(r["gpu_final"] for r in runs)
    return out


def _machine(device: str) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, gpu_memory=p.total_memory, capability=f"{p.major}.{p.minor}")
    try:
        sys.path.insert(0, str(ROOT / "src"))
        import cudaload

        info["capabilities"] = json.loads(cudaload.detect().to_json())
    except Exception as e:  # the snapshot is a courtesy; the numbers stand without it
        info["capabilities_error"] = f"{type(e).__name__}: {e}"
    return info


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# fastload vs from_pretrained ({m['date']})",
        "",
        f"{m.get('gpu', 'CPU')}, torch {m['torch']}, transformers {m['transformers']}, {m['cpus']} CPUs, "
        f"device {report['device']}, reps {report['reps']} (median), bf16 checkpoints loaded as bf16.",
        "",
        "| shape | GB | cache | from_pretrained s | fastload s | ratio | GPU peak GiB fp / fast | "
        "RSS peak GiB fp / fast | weights match |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["shapes"]:
        gb = r["checkpoint_bytes"] / 1e9
        for cache in ("warm", "cold"):
            if cache not in r:
                continue
            fp, fa = r[cache]["from_pretrained"], r[cache]["fastload"]
            lines.append(
                f"| {r['shape']} | {gb:.2f} | {cache} | {fp['seconds']:.3f} | {fa['seconds']:.3f} | "
                f"{fa['seconds'] / fp['seconds']:.2f}x | {_gib(fp.get('gpu_peak'))} / {_gib(fa.get('gpu_peak'))} | "
                f"{_gib(fp['rss_peak'])} / {_gib(fa['rss_peak'])} | {r['weights_match']} |"
            )
    lines += [
        "",
        "| shape | raw bound s (read+copy, no model) | fastload / bound | page-cache read GB/s | "
        "disk read GB/s | cold fastload GB/s / disk |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["shapes"]:
        bound = r["raw_bound"]["seconds"]
        fast = r["warm"]["fastload"]["seconds"]
        disk = r.get("disk_read", {}).get("gb_per_s")
        cold_rate = (r["checkpoint_bytes"] / r["cold"]["fastload"]["seconds"] / 1e9) if "cold" in r else None
        lines.append(
            f"| {r['shape']} | {bound:.3f} | {fast / bound:.2f}x | {r['page_cache_read']['gb_per_s']:.2f} | "
            f"{'-' if disk is None else f'{disk:.2f}'} | "
            f"{'-' if cold_rate is None or disk is None else f'{cold_rate / disk:.2f}'} |"
        )
    if not report["cold_measured"]:
        lines += ["", "Cold loads not measured (--no-cold or --small)."]
    for r in report["shapes"]:
        ev = r.get("evictions")
        if ev:
            worst = max((e["resident_after"] or 0.0) for e in ev)
            lines += [
                "",
                f"{r['shape']} cold: page cache dropped with {ev[0]['how']}; at most {worst:.1%} of the "
                "checkpoint's pages were still cached before a cold load (mincore).",
            ]
        ph = r["warm"]["fastload"].get("phases")
        if ph:
            lines += [
                "",
                f"{r['shape']} fastload phases (last warm run): "
                + ", ".join(f"{k} {v}" for k, v in ph.items() if k.endswith("_s")),
            ]
    lines += [
        "",
        "RSS peak includes the interpreter with torch and transformers imported "
        "(see rss_before in the JSON).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for fastload.json and fastload.md")
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (CI)")
    ap.add_argument("--device", default=None, help="cuda:0 (default with a GPU) or cpu")
    ap.add_argument(
        "--work", default=None, help="where checkpoints are written (default /tmp/cudaload-bench)"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--buffer-bytes", type=int, default=None, help="fastload staging buffer size")
    ap.add_argument("--shard-bytes", type=int, default=5 * 10**9)
    ap.add_argument("--shapes", nargs="*", default=None)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="staging parameter sweep instead of the comparison")
    ap.add_argument("--sweep-worker", action="store_true", help=argparse.SUPPRESS)
    # internal: one measurement in this process
    ap.add_argument("--measure", choices=["from_pretrained", "fastload"])
    ap.add_argument("--bound", action="store_true")
    ap.add_argument("--path")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args(argv)
    if a.sweep_worker:
        print(json.dumps(sweep_worker(a.path, a.device, a.reps)))
        return 0
    if a.measure or a.bound:
        if a.bound:
            out = raw_bound(a.path, a.device, a.threads, a.buffer_bytes)
        else:
            out = measure(a.measure, a.path, a.device, a.dtype, a.threads, a.buffer_bytes)
        print(json.dumps(out))
        return 0
    if not a.out:
        ap.error("--out is required")
    import torch

    a.device = a.device or ("cuda:0" if torch.cuda.is_available() and not a.small else "cpu")
    a.work = a.work or ("/tmp/cudaload-bench-small" if a.small else "/tmp/cudaload-bench")
    if a.small:
        a.shard_bytes = min(a.shard_bytes, 2 << 20)  # several shards even at tiny sizes
    shapes = a.shapes or SHAPES["small" if a.small else "full"]
    cold_ok = not a.no_cold and not a.small
    report: dict[str, Any] = {
        "device": a.device,
        "reps": a.reps,
        "cold_measured": cold_ok,
        "machine": _machine(a.device),
        "shapes": [],
    }
    t0 = time.perf_counter()
    if a.sweep:
        for shape in shapes:
            path = Path(a.work) / shape
            make_checkpoint(shape, path, a.device if a.device.startswith("cuda") else "cpu", a.shard_bytes)
            warm_cache(path)
            r = _child(
                ["--sweep-worker", "--path", str(path), "--device", a.device, "--reps", str(min(a.reps, 2))],
                timeout=600,
            )
            report["shapes"].append({"shape": shape, **r})
            print(f"{shape}: done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps(report, indent=2))
        md = sweep_markdown(report)
        (out / "sweep.md").write_text(md)
        print(md)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md = ""
    for shape in shapes:
        report["shapes"].append(bench_shape(shape, a, cold_ok))
        print(f"{shape}: done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        # written after every shape: a run cut short by its time limit keeps what it measured
        (out / "fastload.json").write_text(json.dumps(report, indent=2))
        md = markdown(report)
        (out / "fastload.md").write_text(md)
    print(md)
    return 0 if all(r["weights_match"] for r in report["shapes"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
