"""cudaload.fastload.sharded: FSDP2 ranks that read only their own shards of the checkpoint (issue 17).

Each multi-rank test starts gloo ranks on this CPU (torch.multiprocessing.spawn, as tests/test_parallelism.py
does), runs one job on every rank and checks what the ranks wrote: every parameter's full tensor and every
buffer equal from_pretrained's bit for bit, the logits of one forward too, each rank read exactly its rows of
each weight (the ranks together read the checkpoint once), and one optimizer step trains.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


# -- helpers run inside the ranks ------------------------------------------------------------------------
def _rank_main(
    rank: int, world: int, port: int, job: str, args: dict[str, Any], out: str, jobs: str = __name__
) -> None:
    """One rank: torchrun's environment, a gloo (or NCCL) group unless the job starts its own, then the job
    named in the ``_JOBS`` of module ``jobs`` (this one, or tests/test_sharded_lora.py)."""
    import importlib

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    if job not in ("load_model", "sharded_fails"):  # these start their own group from this environment
        gpu = bool(args.get("cuda"))
        if gpu:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    res = importlib.import_module(jobs)._JOBS[job](rank, world, args)
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(res, fh)
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another still talks to it
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: once in a few dozen runs a native thread left by gloo aborted
    # it ("terminate called without an active exception"), after the results above were written.
    os._exit(0)


def _count_preadv() -> list[int]:
    """Count the bytes the fast path's reader reads (it reads checkpoint data with os.preadv only)."""
    counted = [0]
    real = os.preadv

    def preadv(fd: int, buffers: Any, offset: int, *a: Any) -> int:
        n = real(fd, buffers, offset, *a)
        counted[0] += n
        return n

    os.preadv = preadv
    return counted


def _expected_bytes(path: str, world: int, rank: int, buffers: set[str], tied: set[str]) -> int:
    """This rank's rows of every checkpoint weight by torch.chunk (FSDP2's split), whole buffers."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in tied:
                    continue
                sl = st.get_slice(name)
                shape = sl.get_shape()
                nbytes = st.get_tensor(name).nbytes
                if name in buffers or not shape:
                    total += nbytes
                    continue
                pieces = list(torch.chunk(torch.arange(shape[0]), world))
                rows = len(pieces[rank]) if rank < len(pieces) else 0
                total += nbytes // shape[0] * rows
    return total


def _job_parity(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from cudaload.fastload.sharded import load_fsdp2

    path = args["path"]
    dtype = getattr(torch, args["dtype"])
    counted = _count_preadv()
    # seeded per rank: what is initialised rather than read must still be one tensor (rank 0's draw)
    torch.manual_seed(rank)
    extra: dict[str, Any] = {}
    if args.get("offload"):
        from torch.distributed.fsdp import CPUOffloadPolicy

        extra["offload_policy"] = CPUOffloadPolicy(pin_memory=False)  # pinning needs CUDA
    model = load_fsdp2(path, dtype=dtype, device="cpu", threads=2, **extra)
    read = counted[0]
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    res: dict[str, Any] = {"fsdp_module": isinstance(model, FSDPModule), "report": model.cudaload_fastload}
    res["read"] = read
    ref_buffers = {n for n, _ in ref.named_buffers()}
    tied_in_ck = set()
    if getattr(ref.config, "tie_word_embeddings", False):
        tied_in_ck = set(getattr(ref, "all_tied_weights_keys", {}) or {})
    res["expected_read"] = _expected_bytes(path, world, rank, ref_buffers, tied_in_ck)
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    got_params = dict(model.named_parameters(remove_duplicate=False))
    res["param_names_equal"] = sorted(ref_params) == sorted(got_params)
    bad: list[str] = []
    for name, p in got_params.items():
        if not isinstance(p, DTensor):
            bad.append(f"{name}: not sharded")
            continue
        full = p.full_tensor()
        r = ref_params[name]
        if full.dtype != r.dtype or not torch.equal(full, r):
            bad.append(f"{name}: values differ")
    ref_b = dict(ref.named_buffers())
    got_b = dict(model.named_buffers())
    res["buffer_names_equal"] = sorted(ref_b) == sorted(got_b)
    for name, b in got_b.items():
        r = ref_b[name]
        if b.dtype != r.dtype or not torch.equal(b, r):
            bad.append(f"buffer {name}: values differ")
    res["bad"] = bad
    res["local_elems"] = sum(p.to_local().numel() for p in model.parameters())  # tied ones once
    res["total_elems"] = sum(p.numel() for p in ref.parameters())
    # tied weights stay one parameter, sharded once
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    res["tied"] = emb.weight is head.weight
    res["ref_tied"] = ref.get_input_embeddings().weight is ref.get_output_embeddings().weight
    # one forward: the same logits
    ids = torch.arange(3, 3 + 12).reshape(1, 12) % ref.config.vocab_size
    with torch.no_grad():
        got = model(input_ids=ids).logits
        want = ref(input_ids=ids).logits
    res["logits_equal"] = bool(torch.equal(got, want))
    res["logits_max_diff"] = float((got.float() - want.float()).abs().max())
    # one optimizer step (the root keeps its parameters gathered after forward: FSDP2's root default, torch 2.13
    # distributed/fsdp/_fully_shard/_fully_shard.py:187-190; reshard() puts the DTensors back)
    model.reshard()
    model.train()
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    res["loss"] = float(loss.detach())
    model.reshard()
    after = {n: p.full_tensor() for n, p in model.named_parameters()}
    res["changed"] = sum(not torch.equal(before[n], after[n]) for n in before)
    res["n_params"] = len(before)
    return res


def _try_load(path: str) -> str:
    """What load_fsdp2 did on this rank: "loaded", or the step-aside / cudaload error it raised."""
    from cudaload.errors import CudaloadError
    from cudaload.fastload import StepAside
    from cudaload.fastload.sharded import load_fsdp2

    try:
        load_fsdp2(path, dtype=torch.float32, device="cpu")
        return "loaded"
    except StepAside as e:
        return f"StepAside: {e.message}"
    except CudaloadError as e:
        return f"{type(e).__name__}: {e.message}"


def _job_bad_input(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, path in args.items():  # fsdp_env last: it changes the environment
        if key == "fsdp_env":
            # what TrainingArguments(fsdp_config={"cpu_ram_efficient_loading": True}) sets (training_args.py:2808)
            os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true")
        out[key] = _try_load(path)
    return out


def _job_disagree(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """Each case gives each rank its own checkpoint (args[case][rank]): what one rank cannot load, no rank
    loads, so that no rank goes on to train (and wait in a collective) while another loaded otherwise."""
    return {case: _try_load(paths[rank]) for case, paths in args.items()}


def _job_sharded_fails(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """execute's sharded branch for a plan whose checkpoint is gone by load time: the error, and whether the
    process group it started is still there."""
    import torch.distributed as dist

    from cudaload.execute.sharded import load_sharded
    from cudaload.plans.plan import Plan

    plan = Plan.from_json(args["plan"])
    notes: list[str] = []
    try:
        load_sharded(plan, "AutoModelForCausalLM", {}, notes)
        error = None
    except Exception as e:
        error = type(e).__name__
    return {"error": error, "group": dist.is_initialized(), "notes": notes}


def _job_load_model(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule

    import cudaload

    caps = _small_gpus(rank, world, args["gpu_bytes"])
    counted = _count_preadv()
    model = cudaload.load_model(
        args["path"], hardware=caps, intent="training", seq_len=64, allow_offload=True, prefetch=False
    )
    read = counted[0]
    p = model.cudaload_plan
    ref = transformers.AutoModelForCausalLM.from_pretrained(args["path"], dtype=torch.bfloat16)
    ref_params = dict(ref.named_parameters())
    bad = []
    for n, q in model.named_parameters():
        full = q.full_tensor()
        n = n.replace("_checkpoint_wrapped_module.", "")  # the planned activation checkpointing's wrapper
        if full.dtype != torch.float32 or not torch.equal(full, ref_params[n].float()):
            bad.append(n)
    # What a Trainer built from training_arguments(plan) does to the model before training (accelerate 1.15
    # Accelerator._prepare_fsdp2, accelerator.py:1694-1732), with the plugin TrainingArguments makes: the wrap
    # policy (by class name), activation checkpointing if asked, then fsdp2_prepare_model, which hands an
    # FSDPModule back as it is (utils/fsdp_utils.py:763-767). A real Trainer cannot run here: on the CPU
    # accelerate picks DDP, not FSDP.
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac

    targs = cudaload.training_arguments(p)
    targs.pop("tf32", None)
    ta = transformers.TrainingArguments(output_dir=f"{args['path']}/out{rank}", use_cpu=True, **targs)
    plugin = FullyShardedDataParallelPlugin(**ta.fsdp_plugin_args)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
    plugin.set_auto_wrap_policy(model)
    prepared = fsdp2_apply_ac(accelerator, model) if plugin.activation_checkpointing else model
    untouched = fsdp2_prepare_model(accelerator, prepared) is model
    wrapped = sum(type(m).__name__.endswith("CheckpointWrapper") for m in model.modules())
    model.train()
    ids = torch.arange(3, 3 + 16).reshape(1, 16)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    par = p.parallelism
    assert par is not None
    return {
        "fsdp_module": isinstance(model, FSDPModule),
        "bad": bad[:5],
        "untouched": untouched,
        "wrapped": wrapped,
        "layers": model.config.num_hidden_layers,
        "plan_checkpointing": par.config["training_arguments"]["fsdp_config"]["activation_checkpointing"],
        "loss": float(loss.detach()),
        "group": dist.is_initialized(),
        "load_path": p.verified["load_path"],
        "plan_load_path": [p.load_path.choice, *p.load_path.reasons],
        "notes": p.verified["notes"],
        "devices": p.verified["devices"],
        "placement": list(p.placement.devices),
        "choice": par.choice,
        "reasons": list(par.decision.reasons),
        "host": par.config.get("host_bytes_per_node"),
        "host_staged": par.config.get("host_bytes_per_node_if_stepped_aside"),
        "params": sum(q.numel() for q in ref.parameters()),
        "read": read,
        "bytes": model.cudaload_fastload["bytes"],
        "checkpoint_bytes": model.cudaload_fastload["checkpoint_bytes"],
        "fsdp_args": cudaload.training_arguments(p).get("fsdp_config"),
    }


def _job_checkpointing(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """Activation checkpointing applied by the loader (as accelerate applies it): the same parameters, and one
    training step gives what the same step without it gives."""
    from cudaload.fastload.sharded import load_fsdp2

    ids = torch.arange(5, 5 + 12).reshape(1, 12)
    out: dict[str, Any] = {}
    sds = []
    for ac in (False, True):
        model = load_fsdp2(args["path"], dtype=torch.float32, device="cpu", activation_checkpointing=ac)
        if ac:
            out["wrapped"] = sum(type(m).__name__.endswith("CheckpointWrapper") for m in model.modules())
            out["state_dict_keys"] = sorted(model.state_dict())
        else:
            out["plain_keys"] = sorted(model.state_dict())
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        model.reshard()
        out[f"loss{int(ac)}"] = float(loss.detach())
        sds.append(
            {
                n.replace("_checkpoint_wrapped_module.", ""): p.full_tensor()
                for n, p in model.named_parameters()
            }
        )
    a, b = sds
    out["same_names"] = sorted(a) == sorted(b)
    out["max_diff"] = max(float((a[n] - b[n]).abs().max()) for n in a)
    return out


def _job_one_rank(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """One rank (world 1, so its shard is the whole tensor): shards on cuda:rank with NCCL when args["cuda"]
    (else the CPU with gloo), and second kept in host memory by CPUOffloadPolicy (pinned on CUDA); float32
    masters computed in bf16 as load_model asks; every tensor against from_pretrained's; one AdamW step."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy

    from cudaload.fastload.sharded import load_fsdp2

    path = args["path"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    ref_buffers = dict(ref.named_buffers())
    assert world == 1  # to_local() below is the whole tensor only then (full_tensor() would gather offloaded
    # CPU shards through NCCL)
    cuda = bool(args.get("cuda"))
    dev = f"cuda:{rank}" if cuda else "cpu"
    bf = torch.bfloat16
    out: dict[str, Any] = {}
    for label, offload in (("device", None), ("offload", CPUOffloadPolicy(pin_memory=cuda))):
        model = load_fsdp2(
            path,
            dtype=torch.float32,
            device=dev,
            mp_policy=MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf),
            offload_policy=offload,
        )
        bad = [
            n
            for n, p in model.named_parameters(remove_duplicate=False)
            if not torch.equal(p.to_local().cpu(), ref_params[n])
        ]
        bad += [f"buffer {n}" for n, b in model.named_buffers() if not torch.equal(b.cpu(), ref_buffers[n])]
        devices = sorted({str(p.to_local().device) for p in model.parameters()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before = [p.to_local().detach().cpu().clone() for p in model.parameters()]
        ids = (torch.arange(3, 3 + 32).reshape(1, 32) % ref.config.vocab_size).to(dev)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        changed = sum(
            not torch.equal(a, p.to_local().detach().cpu())
            for a, p in zip(before, model.parameters(), strict=True)
        )
        out[label] = {
            "fsdp_module": isinstance(model, FSDPModule),
            "bad": bad,
            "param_devices": devices,
            "loss": float(loss),
            "changed": changed,
            "params": len(before),
        }
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return out


_JOBS: dict[str, Callable[[int, int, dict[str, Any]], dict[str, Any]]] = {
    "parity": _job_parity,
    "one_rank": _job_one_rank,
    "bad_input": _job_bad_input,
    "load_model": _job_load_model,
    "checkpointing": _job_checkpointing,
    "disagree": _job_disagree,
    "sharded_fails": _job_sharded_fails,
}


def _small_gpus(rank: int, world: int, gpu_bytes: int) -> Any:
    import dataclasses

    from cudaload.capabilities import Distributed
    from cudaload.profiles import hardware

    # as a torchrun rank sees 2 x H200 shrunk to gpu_bytes each (tests/test_parallelism.py _small_gpus)
    d = Distributed(local_rank=rank, rank=rank, world_size=world, local_world_size=world)
    caps = dataclasses.replace(hardware("2xH200"), distributed=d)
    gpus = tuple(dataclasses.replace(g, total_memory=gpu_bytes, free_memory=gpu_bytes) for g in caps.gpus)
    return dataclasses.replace(caps, gpus=gpus, source="snapshot:small-gpus")


def _spawn(
    world: int, job: str, args: dict[str, Any], tmp: Path, jobs: str = __name__
) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(world, port, job, args, str(tmp), jobs), nprocs=world, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


def _save(kind: str, path: Path, dtype: str = "float32", **overrides: Any) -> Path:
    """A tiny ``kind`` checkpoint with config overrides (make_tiny has none)."""
    from cudaload.testing.models import _TINY, make_tokenizer, tiny_config

    config = tiny_config(kind)
    for k, v in overrides.items():  # tiny_config's own overrides= is shadowed by the family's (models.py:68)
        setattr(config, k, v)
    torch.manual_seed(0)
    model = getattr(transformers, _TINY[kind][1]).from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(path)
    make_tokenizer(config.vocab_size).save_pretrained(path)
    return path


# -- tests -------------------------------------------------------------------------------------------------
def test_shard_rows_are_fsdp2s_chunks() -> None:
    """The rows each rank gets equal FSDP2's own split (torch.chunk, padded with empty chunks), uneven and
    empty ranks included."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from cudaload.fastload.sharded import shard_rows

    for rows in (0, 1, 2, 5, 7, 64, 320, 321):
        for world in (1, 2, 3, 4, 8):
            chunks = _chunk_with_empty(torch.arange(rows), world, dim=0)
            for rank in range(world):
                start, stop = shard_rows(rows, world, rank)
                assert torch.equal(torch.arange(rows)[start:stop], chunks[rank]), (rows, world, rank)


def test_without_a_process_group_the_error_names_the_fix(tiny_model: Callable[..., Path]) -> None:
    import torch.distributed as dist

    from cudaload.errors import ConfigurationError
    from cudaload.fastload.sharded import load_fsdp2

    assert not dist.is_initialized()
    with pytest.raises(ConfigurationError) as e:
        load_fsdp2(tiny_model("qwen3"), dtype=torch.float32)
    assert "init_process_group" in (e.value.fix or "") and "torchrun" in (e.value.fix or "")


def _check_parity(res: list[dict[str, Any]], world: int) -> None:
    for r, x in enumerate(res):
        assert x["fsdp_module"], r
        assert x["param_names_equal"] and x["buffer_names_equal"], r
        assert x["bad"] == [], (r, x["bad"][:5])
        assert x["logits_equal"], (r, x["logits_max_diff"])
        # exactly this rank's rows were read (counted at os.preadv), as the loader reports
        assert x["read"] == x["expected_read"] == x["report"]["bytes"], r
        assert x["report"]["sharded"] == {**x["report"]["sharded"], "world": world, "rank": r}
        assert x["loss"] == x["loss"] and abs(x["loss"]) < 1e6  # finite
        assert x["changed"] == x["n_params"], r
        assert x["tied"] == x["ref_tied"], r
    # the ranks together held every parameter element once, and read each weight byte once
    assert sum(x["local_elems"] for x in res) == res[0]["total_elems"]
    ck = res[0]["report"]["checkpoint_bytes"]
    assert sum(x["read"] for x in res) == ck
    assert max(x["read"] for x in res) < ck / world * 1.2


def test_qwen3_tied_two_ranks(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """Qwen3 with tie_word_embeddings: the embedding and lm_head stay one parameter, sharded once."""
    res = _spawn(2, "parity", {"path": str(tiny_model("qwen3")), "dtype": "float32"}, tmp_path)
    assert all(x["tied"] for x in res)
    _check_parity(res, 2)


def test_qwen3_untied_bf16_checkpoint_loaded_as_float32(tmp_path: Path) -> None:
    """Untied Qwen3, bf16 checkpoint loaded in float32 (the reader converts each shard)."""
    path = _save("qwen3", tmp_path / "ck", dtype="bfloat16", tie_word_embeddings=False)
    res = _spawn(2, "parity", {"path": str(path), "dtype": "float32"}, tmp_path)
    assert not any(x["tied"] for x in res)
    _check_parity(res, 2)


def test_llama_three_ranks_uneven_shards(tmp_path: Path) -> None:
    """3 ranks: vocab 320 and hidden 64 split unevenly (107/107/106, 22/22/20 rows), exactly."""
    path = _save("llama", tmp_path / "ck")
    res = _spawn(3, "parity", {"path": str(path), "dtype": "float32"}, tmp_path)
    _check_parity(res, 3)


def test_mistral_two_ranks_bf16_with_cpu_offload(tmp_path: Path) -> None:
    """Mistral (sliding window) in bf16, sharded with FSDP2's CPUOffloadPolicy (what fsdp2_offload plans use)."""
    path = _save("mistral", tmp_path / "ck", dtype="bfloat16")
    res = _spawn(2, "parity", {"path": str(path), "dtype": "bfloat16", "offload": True}, tmp_path)
    _check_parity(res, 2)


def test_activation_checkpointing_on_the_sharded_model_trains_the_same(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """Activation checkpointing (what fsdp_config asks of accelerate) applied by the loader before sharding:
    one SGD step with it equals the step without it, and state_dict keys stay the checkpoint's."""
    res = _spawn(2, "checkpointing", {"path": str(tiny_model("qwen3"))}, tmp_path)
    for x in res:
        assert x["wrapped"] == 2 and x["same_names"]  # the tiny model's 2 decoder layers
        assert x["state_dict_keys"] == x["plain_keys"]
        assert x["loss0"] == x["loss1"] and x["max_diff"] < 1e-6, {
            k: x[k] for k in ("loss0", "loss1", "max_diff")
        }


def test_missing_keys_are_initialised_as_from_pretrained_does(tmp_path: Path) -> None:
    """A checkpoint without the final norm (initialised to ones by transformers' _init_weights) and without the
    untied lm_head (drawn at random): every rank ends with rank 0's draw, which is from_pretrained's for the
    same seed; the load report names both as missing."""
    from safetensors.torch import load_file, save_file

    path = _save("llama", tmp_path / "ck")
    f = path / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.norm.weight"], sd["lm_head.weight"]
    save_file(sd, str(f), metadata={"format": "pt"})
    res = _spawn(2, "parity", {"path": str(path), "dtype": "float32"}, tmp_path)
    _check_parity(res, 2)
    for x in res:
        assert x["report"]["missing_keys"] == ["lm_head.weight", "model.norm.weight"]


def test_what_the_fast_path_cannot_do_steps_aside(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """Both sides of a tie stored, fused MoE experts (a weight converter), remote code, transformers' FSDP1
    loading switched on by the
    environment, a bad checkpoint: StepAside or the fast path's own error, on every rank, before anything is
    allocated."""
    remote = _save("llama", tmp_path / "remote")
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    (remote / "config.json").write_text(json.dumps(cfg))
    import shutil

    from safetensors.torch import load_file, save_file

    both = tmp_path / "both"
    shutil.copytree(tiny_model("qwen3"), both)
    sd = load_file(str(both / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(both / "model.safetensors"), metadata={"format": "pt"})
    args = {
        "both_tied": str(both),
        "moe": str(tiny_model("qwen3_moe")),
        "remote": str(remote),
        "missing": str(tmp_path / "nope"),
        "fsdp_env": str(tiny_model("qwen3")),
    }
    res = _spawn(2, "bad_input", args, tmp_path)
    for x in res:
        # a tied config whose checkpoint stores the head too: from_pretrained ties by comparing values
        assert x["both_tied"].startswith("StepAside") and "both sides of tied" in x["both_tied"]
        assert x["fsdp_env"].startswith("StepAside") and "FSDP_CPU_RAM_EFFICIENT_LOADING" in x["fsdp_env"]
        assert x["moe"].startswith("StepAside") and "conversion" in x["moe"], x["moe"]
        assert x["remote"].startswith("StepAside") and "remote code" in x["remote"], x["remote"]
        assert x["missing"].startswith("ModelNotFoundError"), x["missing"]


def test_a_rank_that_cannot_load_takes_the_others_with_it(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """Ranks that see different files (a node's copy out of date, a file missing on one node): when one rank
    steps aside or fails, every rank does, before any weight is read; one rank loading sharded while another
    falls back to a whole-model load would leave them in different collectives (a hung job, not an error)."""
    import shutil

    from safetensors.torch import load_file, save_file

    good = tiny_model("qwen3")
    both = tmp_path / "both"
    shutil.copytree(good, both)
    sd = load_file(str(both / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(both / "model.safetensors"), metadata={"format": "pt"})
    # rank 1's copy lacks the final norm: it would initialise it and broadcast it, rank 0 would not listen
    older = tmp_path / "older"
    shutil.copytree(good, older)
    sd = load_file(str(older / "model.safetensors"))
    del sd["model.norm.weight"]
    save_file(sd, str(older / "model.safetensors"), metadata={"format": "pt"})
    args = {
        "step_aside": [str(good), str(both)],
        "missing": [str(good), str(tmp_path / "nope")],
        "differ": [str(good), str(older)],
    }
    res = _spawn(2, "disagree", args, tmp_path)
    for x in res:
        assert x["differ"].startswith("LoadError") and "different checkpoints: ranks [1]" in x["differ"], x
    assert res[1]["step_aside"].startswith("StepAside") and "both sides of tied" in res[1]["step_aside"]
    assert res[0]["step_aside"].startswith("StepAside") and "rank 1" in res[0]["step_aside"], res[0]
    assert res[1]["missing"].startswith("ModelNotFoundError"), res[1]
    assert res[0]["missing"].startswith("LoadError") and "rank 1" in res[0]["missing"], res[0]


def test_a_tie_across_fsdp_units_stays_one_tensor_or_steps_aside(tmp_path: Path) -> None:
    """RoBERTa as a causal LM: its embeddings are one of the _no_split_modules (an FSDP unit of their own) and
    the head's decoder weight, in the root unit, is tied to them. fully_shard gives each unit its own DTensor
    (the tie is cut without a word), and the checkpoint stores only one side: the load must not hand back a
    model whose head was never read. It steps aside on every rank (from_pretrained ties it)."""
    from cudaload.testing.models import make_tokenizer

    cfg = transformers.RobertaConfig(
        vocab_size=320,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        is_decoder=True,
        tie_word_embeddings=True,
    )
    path = tmp_path / "ck"
    torch.manual_seed(0)
    transformers.RobertaForCausalLM(cfg).save_pretrained(path)
    make_tokenizer(cfg.vocab_size).save_pretrained(path)
    res = _spawn(2, "bad_input", {"roberta": str(path)}, tmp_path)
    for x in res:
        assert x["roberta"].startswith("StepAside") and "tied" in x["roberta"], x


@pytest.mark.slow
def test_load_model_under_torchrun_loads_each_ranks_shards(tmp_path: Path) -> None:
    """The whole load_model on two torchrun-like ranks for a plan whose weights (165 M params, bf16) fit no GPU
    whole (FSDP2 with CPU offload): load_model starts the gloo group from the torchrun environment, each rank
    reads only its half of every weight (float32 master shards, as accelerate's upcast would give), the values
    equal from_pretrained's, the plan says where the shards are and what the node's host memory holds, accelerate
    takes the FSDPModule as it is, and one training step runs."""
    from cudaload.policies.parallelism import SHARDED_STAGING_BYTES
    from cudaload.testing.models import make_tokenizer

    cfg = _e2e_config()
    path = tmp_path / "model"
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    make_tokenizer(1024).save_pretrained(path)
    res = _spawn(2, "load_model", {"path": str(path), "gpu_bytes": 1050 * 10**6}, tmp_path)
    ck = res[0]["checkpoint_bytes"]
    for r, x in enumerate(res):
        assert x["fsdp_module"] and x["bad"] == [] and x["untouched"], (r, x["bad"])
        assert x["group"] and x["load_path"] == "fast_sharded", r
        assert x["plan_load_path"][0] == "fast" and "reads only its own rows" in x["plan_load_path"][1]
        assert any("initialised the default process group (gloo)" in n for n in x["notes"])
        assert any(f"this rank read {x['bytes'] / 1e9:.3f} of" in n for n in x["notes"])
        assert x["read"] == x["bytes"] and x["bytes"] < ck / 2 * 1.05, r
        assert x["placement"] == ["cpu"] and x["devices"] == ["cpu"], r
        assert x["choice"] == "fsdp2_offload"
        assert any("reads and holds only its 1/2 of the weights" in t for t in x["reasons"])
        # the node holds 2 ranks' float32 shards (offloaded) and staging buffers, not 2 ranks' upcast models
        assert x["host"] == 2 * (SHARDED_STAGING_BYTES + 4 * x["params"] // 2), r
        assert x["host_staged"] == 2 * 4 * x["params"], r
        assert x["fsdp_args"]["version"] == 2 and x["fsdp_args"]["cpu_offload"] is True
        # the loader applied the planned activation checkpointing once; the Trainer's arguments wrap nothing
        assert x["plan_checkpointing"] and x["wrapped"] == x["layers"], r
        assert (
            x["fsdp_args"]["auto_wrap_policy"] == "NO_WRAP" and not x["fsdp_args"]["activation_checkpointing"]
        )
        assert x["loss"] == x["loss"] and 0 < x["loss"] < 100
    assert sum(x["bytes"] for x in res) == ck


def _sparse_checkpoint(path: Path, config: Any) -> Path:
    """config.json and a model.safetensors whose header is real and whose data is a hole (a sparse file):
    planning reads headers only."""
    import struct

    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    header: dict[str, Any] = {}
    at = 0
    for name, t in model.state_dict().items():
        n = t.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + at)
    return path


def _e2e_config() -> Any:
    """165 M parameters: in bf16 they fit no GPU of 1050 MB whole, FSDP2 with CPU offload fits 2 of them."""
    return transformers.Qwen3Config(
        vocab_size=1024,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=52,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def test_the_plan_says_each_rank_reads_its_shards_and_when_it_cannot(tmp_path: Path) -> None:
    """A torchrun rank's FSDP2 plan for weights that fit no GPU whole: the load path is the sharded fast path,
    the node's host memory is the ranks' shards and staging buffers; fast=False or a keyword only from_pretrained
    honours put back the whole-model CPU load with its host figure and reasons."""
    from cudaload import plan
    from cudaload.policies.parallelism import SHARDED_REASON, SHARDED_STAGING_BYTES

    path = _sparse_checkpoint(tmp_path / "ck", _e2e_config())
    caps = _small_gpus(1, 2, 1050 * 10**6)
    kw: dict[str, Any] = dict(hardware=caps, intent="training", seq_len=64, allow_offload=True)
    p = plan(str(path), **kw)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2_offload" and par.launched
    assert par.config["weights_on_cpu"] and par.config["sharded_load"]
    n = p.model.params
    assert par.config["host_bytes_per_node"] == 2 * (SHARDED_STAGING_BYTES + 4 * n // 2)
    assert par.config["host_bytes_per_node_if_stepped_aside"] == 2 * 4 * n
    assert p.load_path.choice == "fast" and "reads only its own rows" in p.load_path.reasons[0]
    assert any(r.startswith(SHARDED_REASON) for r in par.decision.reasons)
    # the plan's placement is the fallback's (the CPU); load_model records the shards' device once loaded
    assert p.placement.devices == ("cpu",)
    for refused, why in (
        (plan(str(path), fast=False, **kw), "fast=False was passed"),
        (plan(str(path), from_pretrained_kwargs={"key_mapping": {"a": "b"}}, **kw), "key_mapping"),
    ):
        rp = refused.parallelism
        assert rp is not None and not rp.config.get("sharded_load")
        assert rp.config["host_bytes_per_node"] == 2 * 4 * n
        assert refused.load_path.choice == "from_pretrained" and why in refused.load_path.reasons[0]
        text = " ".join(rp.decision.reasons)
        assert SHARDED_REASON not in text and "host memory while the Trainer shards" in text
    # LoRA with gradient checkpointing too (composable checkpoint keeps the names peft saves by:
    # tests/test_sharded_lora.py test_trainer_trains_and_saves_the_sharded_adapters)
    lora = plan(str(path), **{**kw, "intent": "lora"}).parallelism
    assert lora is not None and lora.config["gradient_checkpointing"] and lora.config.get("sharded_load")


def test_a_failed_sharded_load_destroys_the_group_it_started(tmp_path: Path) -> None:
    """load_model's sharded branch starts the default process group from torchrun's environment; when the load
    then fails on every rank, that group is destroyed again (a caller that catches the error is not left with
    it, and torch does not warn at exit about a group never destroyed)."""
    from cudaload import plan

    path = _sparse_checkpoint(tmp_path / "ck", _e2e_config())
    p = plan(
        str(path), hardware=_small_gpus(0, 2, 1050 * 10**6), intent="training", seq_len=64, allow_offload=True
    )
    assert p.parallelism is not None and p.parallelism.config["sharded_load"]
    (path / "model.safetensors").unlink()
    res = _spawn(2, "sharded_fails", {"plan": p.to_json()}, tmp_path)
    for x in res:
        assert x["error"] is not None and not x["group"], x
        assert any("initialised the default process group (gloo)" in n for n in x["notes"]), x


@pytest.mark.slow
def test_bench_sharded_load_smoke_runs_on_this_cpu(tmp_path: Path) -> None:
    """benchmarks/bench_sharded_load.py --smoke: torchrun with 2 gloo ranks, both load modes and the load_model
    part; the sharded ranks read half the checkpoint each and their rows equal the checkpoint's."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_sharded_load.py"), "--smoke", "--out", str(out),
         "--work", str(tmp_path / "work"), "--reps", "1", "--budget-s", "240"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    (rnd,) = res["compare"]
    sharded, staged = rnd["sharded"], rnd["staged"]
    assert all("error" not in x for x in [*sharded, *staged, *res["wiring"]]), res
    assert sum(x["bytes"] for x in sharded) == sharded[0]["checkpoint_bytes"] == staged[0]["bytes"]
    assert not any(x["bad_rows"] for x in sharded)
    assert all(x["load_path"] == "fast_sharded" for x in res["wiring"])
    assert (out / "results.md").read_text().startswith("# FSDP2 sharded loading")


@pytest.mark.parametrize(
    "cuda", [pytest.param(True, marks=pytest.mark.gpu), False], ids=["nccl-cuda", "gloo-cpu"]
)
def test_one_rank_loads_its_shards_on_its_device_and_offloaded(
    cuda: bool, tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """The CUDA side the gloo tests cannot reach (NCCL, shards allocated and filled on cuda:0, pinned CPU offload,
    an optimizer step) on this machine's one GPU; two ranks need the 2-GPU machine. The CPU case runs the same job."""
    import math

    res = _spawn(1, "one_rank", {"path": str(tiny_model("qwen3", "bfloat16")), "cuda": cuda}, tmp_path)[0]
    for label, want in (("device", ["cuda:0" if cuda else "cpu"]), ("offload", ["cpu"])):
        r = res[label]
        assert r["fsdp_module"] and r["bad"] == [], (label, r["bad"])
        assert r["param_devices"] == want, (label, r["param_devices"])
        assert math.isfinite(r["loss"]) and r["changed"] == r["params"], (label, r)
