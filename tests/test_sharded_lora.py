"""LoRA under torchrun FSDP2: the ranks wrap the meta model with peft, shard it and read only their own rows of
the frozen base (cudaload.fastload.sharded.load_fsdp2's peft_config; issue 17).

Multi-rank tests start gloo ranks on this CPU as tests/test_sharded_load.py does (its helpers are reused) and
check what the ranks wrote: every base parameter equals from_pretrained's bit for bit, the LoRA weights are
peft's (names, shapes, dtypes, trainable set as get_peft_model gives; lora_B zero; lora_A one tensor on every
rank), the logits equal the base model's, each rank read only its rows, and one optimizer step trains only the
adapters.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_sharded_load import (  # noqa: E402  (after the importorskips; tests/ is on sys.path under pytest)
    _count_preadv,
    _e2e_config,
    _expected_bytes,
    _save,
    _small_gpus,
    _sparse_checkpoint,
)
from test_sharded_load import _spawn as _spawn_ranks  # noqa: E402


# -- helpers run inside the ranks (started by test_sharded_load's _rank_main, which looks the job up here) -----
def _spawn(world: int, job: str, args: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    return _spawn_ranks(world, job, args, tmp, jobs=__name__)


def _lora_config(**kw: Any) -> Any:
    return peft.LoraConfig(**{"target_modules": "all-linear", **kw})


def _digest(t: Any) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _kaiming_ok(a: Any) -> bool:
    """peft's default lora_A draw: kaiming_uniform_(a=sqrt(5)), i.e. uniform within 1/sqrt(fan_in), not all
    one value."""
    bound = 1 / math.sqrt(a.shape[1])
    return bool(a.abs().max() <= bound and a.std() > bound / 4)


def _try_lora(path: str, **kw: Any) -> str:
    from cudaload.errors import CudaloadError
    from cudaload.fastload import StepAside
    from cudaload.fastload.sharded import load_fsdp2

    try:
        load_fsdp2(path, dtype=torch.bfloat16, device="cpu", peft_config=_lora_config(**kw))
        return "loaded"
    except StepAside as e:
        return f"StepAside: {e.message}"
    except CudaloadError as e:
        return f"{type(e).__name__}: {e.message}"


def _job_lora(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    from cudaload.fastload.sharded import load_fsdp2

    path, bf = args["path"], torch.bfloat16
    counted = _count_preadv()
    torch.manual_seed(rank)  # each rank draws other adapters: the loader must make them rank 0's
    model = load_fsdp2(
        path,
        dtype=bf,
        device="cpu",
        peft_config=_lora_config(),
        mp_policy=MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf),  # load_model's
        activation_checkpointing=bool(args.get("checkpointing")),
    )
    read = counted[0]
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=bf)
    ids = torch.arange(3, 3 + 12).reshape(1, 12) % base.config.vocab_size
    with torch.no_grad():
        want = base(input_ids=ids).logits
    buffers = {n for n, _ in base.named_buffers()}
    tied = set(getattr(base, "all_tied_weights_keys", {}) or {}) if base.config.tie_word_embeddings else set()
    expected_read = _expected_bytes(path, world, rank, buffers, tied)
    ref = peft.get_peft_model(base, _lora_config())  # the whole-model path's wrap
    res: dict[str, Any] = {
        "peft_model": isinstance(model, peft.PeftModel),
        "fsdp_module": isinstance(model, FSDPModule),
        "report": model.cudaload_fastload,
        "read": read,
        "expected_read": expected_read,
    }
    ref_params = dict(ref.named_parameters())
    got_params = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}
    res["names_equal"] = sorted(got_params) == sorted(ref_params)
    res["trainable_equal"] = sorted(n for n, p in got_params.items() if p.requires_grad) == sorted(
        n for n, p in ref_params.items() if p.requires_grad
    )
    res["trainable"] = sum(p.numel() for p in got_params.values() if p.requires_grad)
    bad: list[str] = []
    digests: dict[str, str] = {}
    for name, p in got_params.items():
        r = ref_params.get(name)
        if r is None:
            bad.append(f"{name}: not in get_peft_model's model")
            continue
        if not isinstance(p, DTensor):
            bad.append(f"{name}: not sharded")
            continue
        full = p.full_tensor()
        if full.dtype != r.dtype or full.shape != r.shape or p.requires_grad != r.requires_grad:
            bad.append(f"{name}: {full.dtype} {tuple(full.shape)} {p.requires_grad}, peft: {r.dtype} "
                       f"{tuple(r.shape)} {r.requires_grad}")  # fmt: skip
        elif ".lora_B." in name:
            if full.count_nonzero():
                bad.append(f"{name}: not zero")
        elif ".lora_A." in name:
            digests[name] = _digest(full)
            # peft's draw (kaiming-uniform), in float32 holding bf16 values: peft moves the adapter to the base
            # layer's dtype and upcasts it again; the reference shows both
            for label, a in (("loaded", full), ("peft", r.detach())):
                if not _kaiming_ok(a) or not torch.equal(a, a.to(bf).float()):
                    bad.append(f"{name} ({label}): not peft's kaiming-uniform draw on a bf16 base")
        elif not torch.equal(full, r):
            bad.append(f"{name}: values differ from from_pretrained's")
    res["bad"] = bad
    res["lora_A"] = digests
    ref_buffers = dict(ref.named_buffers())
    res["buffers_equal"] = all(
        torch.equal(b, ref_buffers[n.replace("_checkpoint_wrapped_module.", "")])
        for n, b in model.named_buffers()
    )
    with torch.no_grad():
        got = model(input_ids=ids).logits
    res["logits_equal"] = bool(got.dtype == want.dtype and torch.equal(got, want))
    res["logits_max_diff"] = float((got.float() - want.float()).abs().max())
    # one AdamW step: only the adapters change (lora_A too: AdamW's weight decay, its gradient is 0 while B is)
    model.reshard()
    model.train()
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    model.reshard()
    changed = sorted(n for n, p in model.named_parameters() if not torch.equal(before[n], p.full_tensor()))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    res["only_adapters_changed"] = changed == trainable
    res["frozen_grads"] = sum(p.grad is not None for p in model.parameters() if not p.requires_grad)
    res["loss"] = float(loss.detach())
    if args.get("step_aside"):
        # LoRA on the embeddings too (peft's Embedding layer: lora_embedding_A zeros, B normal), without a
        # mixed-precision policy: bf16 and float32 parameters in one unit are all-gathered as bytes
        cfg = {"target_modules": ["q_proj", "embed_tokens"]}
        emb = load_fsdp2(path, dtype=bf, device="cpu", peft_config=_lora_config(**cfg))
        emb_ref = peft.get_peft_model(
            transformers.AutoModelForCausalLM.from_pretrained(path, dtype=bf), _lora_config(**cfg)
        )
        full = {n: p.full_tensor() for n, p in emb.named_parameters()}
        with torch.no_grad():
            logits = emb(input_ids=ids).logits
        res["embedding_lora"] = {
            "names": sorted(full) == sorted(n for n, _ in emb_ref.named_parameters()),
            "lora_embedding_A_zero": all(
                not t.count_nonzero() for n, t in full.items() if "lora_embedding_A" in n
            ),
            "lora_embedding_B_drawn": all(
                t.dtype == torch.float32 and t.std() > 0.5 for n, t in full.items() if "lora_embedding_B" in n
            ),
            "n_embedding": sum("lora_embedding_" in n for n in full),
            "logits_equal": bool(torch.equal(logits, want)),
        }
        res["step_aside"] = {
            "dora": _try_lora(path, use_dora=True),
            "pissa": _try_lora(path, init_lora_weights="pissa"),
            "no_init": _try_lora(path, init_lora_weights=False),
            "modules_to_save": _try_lora(path, modules_to_save=["lm_head"]),
        }
    return res


def _job_load_model(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    import torch.distributed as dist
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule

    import cudaload

    caps = _small_gpus(rank, world, args["gpu_bytes"])
    counted = _count_preadv()
    torch.manual_seed(rank)
    model = cudaload.load_model(
        args["path"], hardware=caps, intent="lora", seq_len=64, allow_offload=True, prefetch=False
    )
    read = counted[0]
    p = model.cudaload_plan
    base = transformers.AutoModelForCausalLM.from_pretrained(args["path"], dtype=torch.bfloat16)
    params = sum(q.numel() for q in base.parameters())
    ref = peft.get_peft_model(base, peft.LoraConfig(**(p.peft or {"target_modules": "all-linear"})))
    ref_params = dict(ref.named_parameters())
    bad = []
    lora_a: dict[str, str] = {}
    for n, q in model.named_parameters():
        full = q.full_tensor()
        n = n.replace("_checkpoint_wrapped_module.", "")
        r = ref_params.get(n)
        if r is None:
            bad.append(f"{n}: not in get_peft_model's model")
        elif full.dtype != r.dtype or q.requires_grad != r.requires_grad:
            bad.append(f"{n}: dtype or requires_grad")
        elif ".lora_B." in n and full.count_nonzero():
            bad.append(f"{n}: not zero")
        elif ".lora_A." in n:
            lora_a[n] = _digest(full)
        elif ".lora_" not in n and not torch.equal(full, r):
            bad.append(n)
    trainable_names = sorted(
        n.replace("_checkpoint_wrapped_module.", "") for n, q in model.named_parameters() if q.requires_grad
    )
    # What a Trainer built from training_arguments(plan) does to the model before training, as
    # tests/test_sharded_load.py's load_model job does it (accelerate 1.15 Accelerator._prepare_fsdp2): the wrap
    # policy by class name, activation checkpointing if asked, then fsdp2_prepare_model, which hands an
    # FSDPModule back as it is (utils/fsdp_utils.py:763-767), so its upcast (:816-820) never runs
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac

    targs = cudaload.training_arguments(p)
    targs.pop("tf32", None)
    ta = transformers.TrainingArguments(output_dir=f"{args['path']}/out{rank}", use_cpu=True, **targs)
    plugin = FullyShardedDataParallelPlugin(**ta.fsdp_plugin_args)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="bf16")
    plugin.set_auto_wrap_policy(model)
    prepared = fsdp2_apply_ac(accelerator, model) if plugin.activation_checkpointing else model
    untouched = fsdp2_prepare_model(accelerator, prepared) is model
    from torch.distributed._composable.contract import _get_registry

    # the layers checkpointed by torch's composable checkpoint (their names kept: peft saves by names)
    wrapped = sum("checkpoint" in (_get_registry(m) or {}) for m in model.modules())
    wrappers = sum(type(m).__name__.endswith("CheckpointWrapper") for m in model.modules())
    model.train()
    ids = torch.arange(3, 3 + 16).reshape(1, 16)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3).step()
    b_changed = sum(
        bool(q.full_tensor().count_nonzero()) for n, q in model.named_parameters() if ".lora_B." in n
    )
    par = p.parallelism
    assert par is not None
    return {
        "peft_model": isinstance(model, peft.PeftModel),
        "fsdp_module": isinstance(model, FSDPModule),
        "bad": bad[:5],
        "lora_A": lora_a,
        "trainable_equal": trainable_names == sorted(n for n, q in ref_params.items() if q.requires_grad),
        "trainable_verified": p.verified["trainable_parameters"],
        "trainable_ref": sum(q.numel() for q in ref.parameters() if q.requires_grad),
        "untouched": untouched,
        "wrapped": wrapped,
        "wrappers": wrappers,
        "layers": model.config.num_hidden_layers,
        "plan_checkpointing": par.config["training_arguments"]["fsdp_config"]["activation_checkpointing"],
        "loss": float(loss.detach()),
        "b_changed": b_changed,
        "n_lora_b": sum(".lora_B." in n for n, _ in model.named_parameters()),
        "group": dist.is_initialized(),
        "load_path": p.verified["load_path"],
        "plan_load_path": [p.load_path.choice, *p.load_path.reasons],
        "notes": p.verified["notes"],
        "parameters_by_dtype": p.verified["parameters_by_dtype"],
        "placement": list(p.placement.devices),
        "choice": par.choice,
        "reasons": list(par.decision.reasons),
        "host": par.config.get("host_bytes_per_node"),
        "host_staged": par.config.get("host_bytes_per_node_if_stepped_aside"),
        "params": params,
        "read": read,
        "bytes": model.cudaload_fastload["bytes"],
        "checkpoint_bytes": model.cudaload_fastload["checkpoint_bytes"],
        "fsdp_args": cudaload.training_arguments(p).get("fsdp_config"),
        "checkpointing_args": sorted(k for k in targs if "checkpointing" in k),
    }


def _job_one_rank(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """One rank (its shard is the whole tensor): on cuda:rank with NCCL when args["cuda"] (else the CPU with
    gloo), and again kept in host memory by CPUOffloadPolicy (pinned on CUDA); a bf16 base computed in bf16
    as load_model asks: base values, lora_B zero, the base model's logits, one AdamW step on the adapters."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy

    from cudaload.fastload.sharded import load_fsdp2

    assert world == 1  # to_local() is the whole tensor only then
    path, bf = args["path"], torch.bfloat16
    cuda = bool(args.get("cuda"))
    dev = f"cuda:{rank}" if cuda else "cpu"
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=bf).to(dev)
    ids = (torch.arange(3, 3 + 32).reshape(1, 32) % base.config.vocab_size).to(dev)
    with torch.no_grad():
        want = base(input_ids=ids).logits
    ref = dict(peft.get_peft_model(base, _lora_config()).named_parameters())
    out: dict[str, Any] = {}
    runs = (
        ("device", None, False),
        ("offload", CPUOffloadPolicy(pin_memory=cuda), False),
        ("checkpointed", None, True),  # torch's composable checkpoint on each layer, recomputed in backward
    )
    for label, offload, checkpointing in runs:
        model = load_fsdp2(
            path,
            dtype=bf,
            device=dev,
            peft_config=_lora_config(),
            mp_policy=MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf),
            offload_policy=offload,
            activation_checkpointing=checkpointing,
        )
        bad = []
        for n, p in model.named_parameters():
            local, r = p.to_local().detach().cpu(), ref[n].detach().cpu()
            if local.dtype != r.dtype or p.requires_grad != ref[n].requires_grad:
                bad.append(f"{n}: {local.dtype} {p.requires_grad}, peft: {r.dtype} {ref[n].requires_grad}")
            elif ".lora_B." in n and local.count_nonzero():
                bad.append(f"{n}: not zero")
            elif ".lora_" not in n and not torch.equal(local, r):
                bad.append(n)
        with torch.no_grad():
            got = model(input_ids=ids).logits
        model.reshard()
        model.train()
        before = {n: p.to_local().detach().cpu().clone() for n, p in model.named_parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        changed = sorted(
            n for n, p in model.named_parameters() if not torch.equal(before[n], p.to_local().detach().cpu())
        )
        out[label] = {
            "fsdp_module": isinstance(model, FSDPModule) and isinstance(model, peft.PeftModel),
            "bad": bad[:5],
            "param_devices": sorted({str(p.to_local().device) for p in model.parameters()}),
            "logits_equal": bool(torch.equal(got, want)),
            "logits_max_diff": float((got.float() - want.float()).abs().max()),
            "loss": float(loss.detach()),
            "only_adapters_changed": changed
            == sorted(n for n, p in model.named_parameters() if p.requires_grad),
        }
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return out


def _job_trainer(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    """A real transformers Trainer on the sharded PeftModel: two steps, then trainer.save_model. accelerate
    enables FSDP only on GPUs (1.15 state.py:986-1016), so the Trainer's accelerator state is switched to FSDP2 by
    hand after __init__, as it stands on GPUs; everything after (accelerator.prepare -> _prepare_fsdp2, the
    optimizer swap by data_ptr, get_state_dict, PeftModel.save_pretrained) is the released code."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from safetensors.torch import load_file
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from cudaload.fastload.sharded import load_fsdp2

    bf = torch.bfloat16
    torch.manual_seed(rank)
    model = load_fsdp2(
        args["path"], dtype=bf, device="cpu", peft_config=_lora_config(r=args["r"]),
        mp_policy=MixedPrecisionPolicy(param_dtype=bf, reduce_dtype=bf, output_dtype=bf),
        activation_checkpointing=True,
    )  # fmt: skip
    out = f"{args['out']}/trainer{rank}"
    ta = transformers.TrainingArguments(
        output_dir=out, use_cpu=True, fsdp=True, bf16=True, max_steps=2, per_device_train_batch_size=1,
        learning_rate=1e-2, report_to=[], save_strategy="no", remove_unused_columns=False,
        fsdp_config={"version": 2, "auto_wrap_policy": "NO_WRAP", "activation_checkpointing": False,
                     "cpu_ram_efficient_loading": False},
    )  # fmt: skip
    ids = torch.arange(3, 19)
    trainer = transformers.Trainer(
        model=model, args=ta, train_dataset=[{"input_ids": ids, "labels": ids}] * 4
    )
    plugin = FullyShardedDataParallelPlugin(**ta.fsdp_plugin_args)
    plugin.set_mixed_precision("bf16")
    trainer.accelerator.state.distributed_type = DistributedType.FSDP
    # AcceleratorState() copies PartialState's shared state over its own on every construction (accelerate
    # 1.15 state.py:919), which train() does: set it where it is read from
    PartialState().distributed_type = DistributedType.FSDP
    trainer.accelerator.state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True
    trainer.train()
    opt = {id(q) for g in trainer.optimizer.param_groups for q in g["params"]}
    trainer.save_model(f"{args['out']}/saved")
    full = {
        n: q.full_tensor() for n, q in model.named_parameters() if ".lora_" in n
    }  # every rank: collectives
    res: dict[str, Any] = {
        "optimizer_holds_the_adapters": opt == {id(q) for q in model.parameters() if q.requires_grad}
    }
    if rank == 0:
        saved = load_file(f"{args['out']}/saved/adapter_model.safetensors")
        res["saved"] = len(saved)
        res["equal"] = sum(
            torch.equal(
                saved.get(n.replace(".default", "").replace("_checkpoint_wrapped_module.", ""), ids), t
            )
            for n, t in full.items()
        )
        res["adapters"] = len(full)
    return res


_JOBS: dict[str, Callable[[int, int, dict[str, Any]], dict[str, Any]]] = {
    "lora": _job_lora,
    "load_model": _job_load_model,
    "one_rank": _job_one_rank,
    "trainer": _job_trainer,
}


# -- tests -------------------------------------------------------------------------------------------------
def _check_lora(res: list[dict[str, Any]], world: int) -> None:
    for r, x in enumerate(res):
        assert x["peft_model"] and x["fsdp_module"], r
        assert x["names_equal"] and x["trainable_equal"], r
        assert x["bad"] == [], (r, x["bad"][:5])
        assert x["buffers_equal"], r
        assert x["logits_equal"], (r, x["logits_max_diff"])
        assert x["read"] == x["expected_read"] == x["report"]["bytes"], r
        assert x["report"]["sharded"]["lora_tensors"] == 2 * len(x["lora_A"]), r
        assert x["only_adapters_changed"] and x["frozen_grads"] == 0, r
        assert math.isfinite(x["loss"]), r
    # the ranks were seeded apart: every rank holds rank 0's adapters
    assert res[0]["lora_A"] and all(x["lora_A"] == res[0]["lora_A"] for x in res)
    ck = res[0]["report"]["checkpoint_bytes"]
    assert sum(x["read"] for x in res) == ck


def test_lora_on_two_ranks_is_peft_on_the_base_and_steps_aside_on_what_needs_base_values(
    tmp_path: Path,
) -> None:
    """Untied Llama, bf16: the sharded PeftModel equals get_peft_model(from_pretrained(...)) in names, dtypes,
    trainable set and base values, lora_B is zero and lora_A rank 0's kaiming draw everywhere, the logits are
    the base model's, each rank read its rows, one AdamW step trains only the adapters; LoRA on the embeddings
    too; DoRA, PiSSA, init_lora_weights=False and modules_to_save step aside on every rank."""
    path = _save("llama", tmp_path / "ck", dtype="bfloat16")
    res = _spawn(2, "lora", {"path": str(path), "step_aside": True}, tmp_path)
    _check_lora(res, 2)
    for x in res:
        e = x["embedding_lora"]
        assert e["n_embedding"] == 2 and all(e.values()), e
        sa = x["step_aside"]
        assert sa["dora"].startswith("StepAside") and "DoRA" in sa["dora"], sa
        assert sa["pissa"].startswith("StepAside") and "init_lora_weights='pissa'" in sa["pissa"], sa
        assert sa["no_init"].startswith("StepAside") and "init_lora_weights=False" in sa["no_init"], sa
        assert sa["modules_to_save"].startswith("StepAside") and "modules_to_save" in sa["modules_to_save"]


def test_lora_tied_with_activation_checkpointing(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    """Qwen3 with tied embeddings, the layers checkpointed (what fsdp_config asks; torch's composable checkpoint,
    which keeps the names): the same. And the
    adapters are rank 0's draw: one rank alone, seeded as rank 0 was, holds the same full lora_A tensors (each
    of two ranks holds its rows of one tensor, not its rows of its own draw)."""
    args = {"path": str(tiny_model("qwen3", "bfloat16")), "checkpointing": True}
    res = _spawn(2, "lora", args, tmp_path)
    _check_lora(res, 2)
    one = tmp_path / "one"
    one.mkdir()
    (alone,) = _spawn(1, "lora", args, one)
    assert alone["bad"] == [] and alone["lora_A"] == res[0]["lora_A"]


def test_the_plan_shards_lora_and_not_qlora(tmp_path: Path) -> None:
    """A torchrun rank's LoRA plan whose bf16 base fits no GPU whole: the sharded load, with the node's host
    memory as the ranks' bf16 base and float32 adapter shards (offloaded) plus staging buffers; QLoRA keeps
    its blocker (from_pretrained quantizes)."""
    from cudaload import plan
    from cudaload.model_info import model_info
    from cudaload.policies.parallelism import SHARDED_REASON, sharded_load_blockers

    path = _sparse_checkpoint(tmp_path / "ck", _e2e_config())
    caps = _small_gpus(1, 2, 1050 * 10**6)
    # this plan trains with gradient checkpointing: the layers are checkpointed without renaming them, so
    # Trainer.save_model finds the adapters (test_trainer_trains_and_saves_the_sharded_adapters)
    p = plan(str(path), hardware=caps, intent="lora", seq_len=64, allow_offload=True)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2_offload" and par.config.get("sharded_load")
    assert par.config["gradient_checkpointing"]
    info = model_info(str(path))
    assert sharded_load_blockers(info, "fsdp2", intent="lora", dtype="bfloat16", quantization=None) == []
    assert SHARDED_REASON in " ".join(par.decision.reasons)
    q = sharded_load_blockers(info, "fsdp2", intent="qlora", dtype="bfloat16", quantization="nf4")
    assert any("nf4" in b for b in q) and any("intent qlora" in b for b in q)


def test_70b_lora_on_8_gpus_of_80gb_with_checkpointing_loads_each_ranks_shards(tmp_path: Path) -> None:
    """Issue 17's case: a 70B LoRA under torchrun on 8 x 80 GB, whose bf16 base (141 GB) fits no GPU whole and
    fits with gradient checkpointing only. The layers are checkpointed by torch's composable checkpoint, which
    keeps the parameter names peft saves by (test_trainer_trains_and_saves_the_sharded_adapters), so each rank
    reads its rows: the host holds staging, not 8 bf16 models (more than this 1 TiB host)."""
    import dataclasses

    from cudaload import plan
    from cudaload.capabilities import Distributed
    from cudaload.policies.parallelism import SHARDED_REASON, SHARDED_STAGING_BYTES
    from cudaload.profiles import hardware
    from cudaload.testing import full_config

    path = _sparse_checkpoint(tmp_path / "ck", full_config("Llama-3.1-70B"))  # the header; the data a hole
    d = Distributed(local_rank=0, rank=0, world_size=8, local_world_size=8)
    caps = dataclasses.replace(hardware("8xH100-80GB"), distributed=d, host_memory=1 << 40)
    p = plan(str(path), hardware=caps, intent="lora", seq_len=2048)
    par = p.parallelism
    assert par is not None and par.choice == "fsdp2" and par.config.get("sharded_load"), par
    assert par.config["gradient_checkpointing"]
    assert par.config["host_bytes_per_node"] <= 8 * SHARDED_STAGING_BYTES < 1 << 40
    # stepping aside would need the 8 whole bf16 models this host does not have: said beside the plan
    assert par.config["host_bytes_per_node_if_stepped_aside"] == 8 * 2 * p.model.params > 1 << 40
    assert SHARDED_REASON in " ".join(par.decision.reasons)


@pytest.mark.slow
def test_load_model_lora_under_torchrun_loads_each_ranks_shards(tmp_path: Path) -> None:
    """load_model(intent="lora") on two torchrun-like ranks whose bf16 base (165 M params) fits no GPU whole:
    each rank reads its half of the base, the model is a PeftModel and an FSDPModule (not wrapped again),
    accelerate takes it as it is, the trainable parameters are peft's, one training step trains the adapters,
    and the plan says so."""
    from cudaload.policies.parallelism import SHARDED_STAGING_BYTES
    from cudaload.testing.models import make_tokenizer

    cfg = _e2e_config()
    path = tmp_path / "model"
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    make_tokenizer(1024).save_pretrained(path)
    res = _spawn(2, "load_model", {"path": str(path), "gpu_bytes": 1050 * 10**6}, tmp_path)
    ck = res[0]["checkpoint_bytes"]
    for r, x in enumerate(res):
        assert x["peft_model"] and x["fsdp_module"] and x["untouched"], r
        assert x["bad"] == [] and x["trainable_equal"], (r, x["bad"])
        assert x["trainable_verified"] == x["trainable_ref"] > 0, r
        assert x["group"] and x["load_path"] == "fast_sharded", r
        assert x["plan_load_path"][0] == "fast" and "reads only its own rows" in x["plan_load_path"][1]
        assert any("wrapped by peft before sharding" in n for n in x["notes"]), x["notes"]
        assert x["read"] == x["bytes"] and x["bytes"] < ck / 2 * 1.05, r
        assert x["placement"] == ["cpu"] and x["choice"] == "fsdp2_offload", r
        # the frozen base in bf16, the adapters in float32
        assert set(x["parameters_by_dtype"]) == {"bfloat16", "float32"}, x["parameters_by_dtype"]
        # host memory: the offloaded bf16 base and float32 adapter shards and staging buffers
        assert x["host"] == 2 * (SHARDED_STAGING_BYTES + (2 * x["params"] + 4 * x["trainable_ref"]) // 2), r
        assert x["host_staged"] == 2 * 2 * x["params"], r
        assert x["plan_checkpointing"] and x["wrapped"] == x["layers"] and x["wrappers"] == 0, r
        assert (
            x["fsdp_args"]["auto_wrap_policy"] == "NO_WRAP" and not x["fsdp_args"]["activation_checkpointing"]
        )
        assert x["checkpointing_args"] == [], x["checkpointing_args"]
        assert math.isfinite(x["loss"]) and x["b_changed"] == x["n_lora_b"], r
    assert res[0]["lora_A"] == res[1]["lora_A"]
    assert sum(x["bytes"] for x in res) == ck


@pytest.mark.parametrize(
    "cuda", [pytest.param(True, marks=pytest.mark.gpu), False], ids=["nccl-cuda", "gloo-cpu"]
)
def test_one_rank_lora_on_its_device_and_offloaded(
    cuda: bool, tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """The CUDA side the gloo tests cannot reach (NCCL, the LoRA weights broadcast and sharded on cuda:0,
    pinned CPU offload, the layers checkpointed, a bf16 forward against the base model's, an AdamW step) on one
    GPU; the CPU case runs the same job."""
    res = _spawn(1, "one_rank", {"path": str(tiny_model("qwen3", "bfloat16")), "cuda": cuda}, tmp_path)[0]
    on = ["cuda:0" if cuda else "cpu"]
    for label, want in (("device", on), ("offload", ["cpu"]), ("checkpointed", on)):
        r = res[label]
        assert r["fsdp_module"] and r["bad"] == [], (label, r["bad"])
        assert r["param_devices"] == want, (label, r["param_devices"])
        assert r["logits_equal"], (label, r["logits_max_diff"])
        assert math.isfinite(r["loss"]) and r["only_adapters_changed"], (label, r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "r",
    [
        8,
        pytest.param(
            1,
            marks=pytest.mark.xfail(
                strict=True,
                reason="found by review7: with LoRA r below the ranks some adapter shards are empty, and "
                "accelerate maps the optimizer's parameters to the sharded ones by data_ptr, which empty shards "
                "share; load_fsdp2 steps aside for it, so this job stops there",
            ),
        ),
    ],
)
def test_trainer_trains_and_saves_the_sharded_adapters(
    r: int, tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """The HF Trainer on the sharded PeftModel: its optimizer holds the adapters themselves on every rank, and
    trainer.save_model writes every adapter, equal to the trained full tensors, on rank 0."""
    args = {"path": str(tiny_model("qwen3", "bfloat16")), "out": str(tmp_path), "r": r}
    res = _spawn(2, "trainer", args, tmp_path)
    assert all(x["optimizer_holds_the_adapters"] for x in res), res
    assert res[0]["saved"] == res[0]["equal"] == res[0]["adapters"] > 0, res[0]


def test_the_sharded_wrap_translates_peft_errors_with_load_models_wrapper(
    tiny_model: Callable[..., Path],
) -> None:
    """load_model's FSDP2 path hands fastload its checked get_peft_model (execute.sharded): a target_modules
    typo is a ConfigurationError naming the model's layers there too, not peft's raw error."""
    import torch
    import transformers
    from peft import LoraConfig

    from cudaload.errors import ConfigurationError
    from cudaload.execute.adapters import get_peft_model_checked
    from cudaload.fastload.sharded.lora import _wrap_lora

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model("qwen3")), dtype=torch.float32)
    cfg = LoraConfig(r=4, target_modules=["q_prj"], task_type="CAUSAL_LM")
    with pytest.raises(ConfigurationError, match="q_proj"):
        _wrap_lora(model, cfg, torch.device("cpu"), "root", get_peft_model_checked)
