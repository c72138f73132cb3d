"""``cudaload precompile``: byte-compile the packages a load imports (cudaload.commands.bytecache), check whether new
processes would compile them (``--check``), or warm a model's compiled decode (``--decode MODEL``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ...errors import ConfigurationError, CudaloadError
from .inputs import checked_request, comma_list, positive_int


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> None:
    pc = sub.add_parser(
        "precompile",
        parents=list(parents),
        help="byte-compile the packages a load imports, so new processes stop compiling them from source",
        description="Byte-compile torch, transformers and the other packages a load imports (as pip does when it "
        "installs), for environments where they have no cached bytecode and Python may not write it "
        "(PYTHONDONTWRITEBYTECODE=1, uv without --compile-bytecode, a read-only install): there every new "
        "process compiles them from source again. Run once per installation.",
    )
    pc.add_argument(
        "--prefix", metavar="DIR", help="write the caches under DIR (then set PYTHONPYCACHEPREFIX=DIR)"
    )
    pc.add_argument(
        "--packages",
        type=comma_list,
        metavar="PKG,...",
        help="top-level packages (default: what a load imports)",
    )
    pc.add_argument(
        "-j", "--jobs", type=int, default=0, metavar="N", help="compile processes (default: one per CPU)"
    )
    pc.add_argument(
        "--check", action="store_true", help="only say whether new processes compile them (exit 1 if so)"
    )
    pc.add_argument("--json", action="store_true", help="print the report as JSON")
    pc.add_argument(
        "--decode",
        metavar="MODEL",
        help="instead: load MODEL with a compiled decode (a static cache) and compile generate()'s decode step "
        "now for each planned batch size, saving torch's compile artifacts under CUDALOAD_CACHE for later processes",
    )
    pc.add_argument(
        "--seq-len",
        type=positive_int,
        metavar="N",
        help="with --decode: the longest prompt + new tokens a call will have (the static cache's bucket)",
    )
    pc.add_argument("--batch-size", type=positive_int, metavar="N", help="with --decode: sequences per call")
    pc.add_argument(
        "--new-tokens",
        type=positive_int,
        metavar="N",
        help="with --decode: of --seq-len, the tokens generated",
    )
    pc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    decode_only = {
        "--seq-len": args.seq_len,
        "--batch-size": args.batch_size,
        "--new-tokens": args.new_tokens,
    }
    if args.decode is not None:
        return _decode(args)
    given = [flag for flag, value in decode_only.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} size the compiled decode that --decode MODEL warms",
            fix="add --decode MODEL, or leave them out to byte-compile packages",
        )
    if args.check:
        return _check(args)
    if args.jobs < 0:
        raise ConfigurationError(
            f"--jobs {args.jobs} is not a number of processes", fix="pass --jobs 0 (one per CPU) or more"
        )
    from ..bytecache import precompile

    report = precompile(args.packages, prefix=args.prefix, workers=args.jobs)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.summary())
    return 0 if report.ok else 1


def _check(args: argparse.Namespace) -> int:
    """`--check`: whether new processes compile the packages a load imports again (exit 1 if so)."""
    import os

    from ...detection.bytecode import finding_text, probe

    # under --prefix: whether processes started with PYTHONPYCACHEPREFIX=DIR would find the caches there
    saved = sys.pycache_prefix
    if args.prefix:
        sys.pycache_prefix = os.path.abspath(args.prefix)
    try:
        state = probe()
    finally:
        sys.pycache_prefix = saved
    for p in state.packages:
        print(
            f"{p.name}: {p.cached} of {p.sampled} sampled modules have cached bytecode"
            + ("" if p.writable or p.cached == p.sampled else "; Python will not write the missing ones")
        )
    text = finding_text(state)
    print(
        f"{text[0]}\nfix: {text[1]}"
        if text
        else "no package a load imports is compiled again by each process"
    )
    return 1 if text else 0


def _decode(args: argparse.Namespace) -> int:
    """`cudaload precompile --decode MODEL`: load MODEL as load_model(decode="compiled", warmup=True) would, which
    compiles generate()'s decode step for each planned batch size and saves torch's compile artifacts under
    CUDALOAD_CACHE; a later process planning the same model, bucket and batch sizes on this torch and GPU loads them
    (cudaload.execute.decode). The request is checked before torch is imported."""
    clash = [
        f
        for f, on in (("--check", args.check), ("--packages", args.packages), ("--prefix", args.prefix))
        if on
    ]
    if clash:
        raise ConfigurationError(
            f"--decode MODEL warms a model's compiled decode; {', '.join(clash)} byte-compile packages",
            fix="run them as two commands",
        )
    if args.seq_len is None:
        raise ConfigurationError(
            "--decode MODEL compiles for a static cache of --seq-len slots (the longest prompt + new tokens)",
            fix="add --seq-len N (e.g. --seq-len 2048), and --batch-size for batched calls",
        )
    req = checked_request(
        args.decode,
        "load_model",
        seq_len=args.seq_len,
        batch_size=args.batch_size or 1,  # with --seq-len, the declared work the decode plan is made for
        new_tokens=args.new_tokens,
        decode="compiled",
        warmup=True,
    )
    from ...execute import load_request

    try:
        model = load_request(req)
    except CudaloadError as e:
        # the request's decode='compiled' is this command's own: its refusal's fix names what the machine or
        # model lacks, not the dynamic decode (which precompiles nothing)
        e.message = e.message.replace("decode='compiled'", "a compiled decode")
        e.fix = e.fix and e.fix.replace("use decode='dynamic', or ", "")
        raise
    plan = model.cudaload_plan
    got = plan.verified.get("decode") or {}
    warm = got.get("warmup") or {}
    if not warm.get("compiled"):
        why = got.get("why") or warm.get("why") or "the load did not compile the decode step"
        print(f"cudaload: nothing precompiled for {plan.model.name}: {why}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps({"model": plan.model.name, "decode": plan.decode.to_dict(), "verified": got}, indent=1)
        )
        return 0
    saved = warm["artifacts_saved"]
    loaded = warm["artifacts_loaded"]
    print(
        f"{plan.model.name}: decode compiled for a static cache of {plan.decode.max_cache_len:,} slots, batch sizes "
        f"{', '.join(str(b) for b in warm['batch_sizes'])}, in {warm['compile_s']:.1f} s"
        + f" ({warm['graphs_compiled']} graphs compiled, {warm['graphs_from_cache']} from the cache"
        + (f"; {loaded['bytes']:,} bytes of saved artifacts loaded)" if loaded.get("entries") else ")")
    )
    for b in warm["per_batch"]:
        print(f"  batch {b['batch']}: first call {b['first_s']:.2f} s, second {b['second_s']:.3f} s")
    if saved.get("path"):
        print(f"artifacts: {saved['path']} ({saved['bytes']:,} bytes)")
    else:
        print(f"artifacts not saved: {saved.get('why') or saved.get('error')}")
        return 1
    return 0
