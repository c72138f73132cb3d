"""Ranks that plan alike (issue 17): every torchrun rank plans from the same GPU facts, refuses a launch on
mixed GPUs or a shared GPU alike, and compares what it chose with the others before any weights move.

The pure part runs over profiles as two single-GPU nodes would see them; the exchange runs for real under
``torchrun`` on this CPU (two ranks meeting in the store torchrun's agent hosts) and through an initialised
gloo group's store."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cudaload import plan
from cudaload.capabilities import Capabilities, Distributed, RankGPU
from cudaload.errors import ConfigurationError, DeviceSelectionError, DoesNotFitError, LoadError
from cudaload.policies.ranks import agree, check_same, decisions, facts
from cudaload.profiles import hardware
from cudaload.testing import full_config

GiB = 1 << 30
SRC = Path(__file__).resolve().parents[1] / "src"


def node(
    rank: int, free: int, host: str, world: int = 2, profile: str = "2xH200"
) -> tuple[Capabilities, RankGPU]:
    """What rank ``rank`` of ``world`` single-GPU nodes detects (its GPU with ``free`` bytes free) and
    publishes."""
    h = hardware(profile)
    g = dataclasses.replace(h.gpus[0], free_memory=free, uuid=f"GPU-{host}-0")
    caps = dataclasses.replace(
        h, gpus=(g,), distributed=Distributed(local_rank=0, rank=rank, world_size=world, local_world_size=1)
    )
    return caps, facts(caps, host)


def test_alone_two_nodes_plan_differently_and_would_hang() -> None:
    """The hazard: near a threshold, ranks that plan from their own GPU alone choose different strategies."""
    (c0, _), (c1, _) = node(0, 60 * GiB, "a"), node(1, 20 * GiB, "b")
    # transformers' loss: the chunked loss would let the 20 GiB rank hold a replica too (another threshold)
    p0 = plan(full_config("Qwen3-8B"), hardware=c0, intent="lora", seq_len=2048, loss="transformers")
    p1 = plan(full_config("Qwen3-8B"), hardware=c1, intent="lora", seq_len=2048, loss="transformers")
    assert p0.parallelism is not None and p1.parallelism is not None
    assert (p0.parallelism.choice, p1.parallelism.choice) == ("ddp", "fsdp2")
    with pytest.raises(ConfigurationError, match="parallelism: ranks 0 'ddp'; ranks 1 'fsdp2'"):
        check_same([{"decisions": decisions(p0)}, {"decisions": decisions(p1)}])


def test_agreed_ranks_name_the_full_gpu_alike() -> None:
    (c0, f0), (c1, f1) = node(0, 60 * GiB, "a"), node(1, 40 * GiB, "b")
    msgs = []
    for caps in (c0, c1):
        agreed = agree(caps, [f1, f0])  # in any order
        assert [r.rank for r in agreed.distributed.ranks] == [0, 1]
        assert agreed.gpus[0].free_memory == 60 * GiB  # planned as the healthiest rank's GPU
        with pytest.raises(DoesNotFitError) as e:
            plan(full_config("Qwen3-8B"), hardware=agreed, intent="lora", seq_len=2048)
        msgs.append(str(e.value))
        assert "rank 1's GPU (cuda:0 on b" in str(e.value) and "40.0 GiB free" in str(e.value)
        assert "nvidia-smi on b" in (e.value.fix or "")
    assert msgs[0] == msgs[1]


def test_agreed_ranks_plan_the_same_and_the_plan_says_so() -> None:
    (c0, f0), (c1, f1) = node(0, 60 * GiB, "a"), node(1, 58 * GiB, "b")
    plans = [
        plan(full_config("Qwen3-8B"), hardware=agree(c, [f0, f1]), intent="lora", seq_len=2048)
        for c in (c0, c1)
    ]
    check_same([{"decisions": decisions(p)} for p in plans])
    assert plans[0].parallelism is not None and plans[0].parallelism.choice == "ddp"
    text = plans[1].explain()
    assert "Ranks: 2 on 2 hosts, NVIDIA H200 each" in text
    assert "the least: rank 1 (58.00 GiB)" in text
    # the facts travel with the plan and the Capabilities
    assert plans[1].hardware["distributed"]["ranks"][1]["host"] == "b"
    again = Capabilities.from_json(agree(c1, [f0, f1]).to_json())
    assert again.distributed.ranks == (f0, f1)


def test_mixed_gpu_models_across_nodes_are_refused_alike() -> None:
    (c0, f0) = node(0, 70 * GiB, "a", world=3)
    (_, f1) = node(1, 70 * GiB, "a2", world=3)
    (c2, f2) = node(2, 70 * GiB, "b", world=3, profile="A100-80GB")
    for caps in (c0, c2):
        with pytest.raises(DeviceSelectionError) as e:
            agree(caps, [f0, f1, f2])
        msg = str(e.value)
        assert "ranks 0-1 (a, a2): NVIDIA H200 (sm90" in msg and "rank 2 (b): NVIDIA A100" in msg
        assert "one GPU model" in (e.value.fix or "")


def test_two_ranks_on_one_gpu_and_missing_ranks_are_refused() -> None:
    (c0, f0), (_, f1) = node(0, 70 * GiB, "a"), node(1, 70 * GiB, "a")
    same = dataclasses.replace(f1, uuid=f0.uuid)
    with pytest.raises(DeviceSelectionError, match="ranks 0 and 1 on a both run on the GPU GPU-a-0"):
        agree(c0, [f0, same])
    with pytest.raises(ConfigurationError, match=r"are \[0\], not 0..1"):
        agree(c0, [f0])


def test_a_rank_that_failed_to_plan_stops_the_others() -> None:
    (c0, f0) = node(0, 60 * GiB, "a")
    p0 = plan(full_config("Qwen3-0.6B"), hardware=agree(c0, [f0, node(1, 60 * GiB, "b")[1]]), intent="lora")
    with pytest.raises(LoadError, match="rank 1 could not plan \\(InvalidChoiceError: bad\\)"):
        check_same([{"decisions": decisions(p0)}, {"error": "InvalidChoiceError: bad"}])


# -- the exchange, for real ------------------------------------------------------------------------------
WORKER = """
import json, os, sys
import torch.distributed as dist
import cudaload

path, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["RANK"])
kw = {}
if mode == "differ" and rank == 1:
    kw["dtype"] = "bfloat16"
if mode == "fail" and rank == 1:
    kw["attn"] = "no_such_attention"
if mode == "group":
    dist.init_process_group("gloo")
if mode == "broken" and rank == 1:
    os.environ["CUDALOAD_HUB_TIMEOUT"] = "abc"  # a bad variable: this rank refuses before the GPU exchange
if mode == "noimport" and rank == 1:
    sys.modules["transformers"] = None  # this rank's import fails between the two exchanges
if mode == "late" and rank == 1:
    import time
    time.sleep(float(os.environ["CUDALOAD_RANKS_TIMEOUT"]) + 4)  # rank 0 gives up waiting and plans alone
try:
    m = cudaload.load_model(path, **kw)
    p = m.cudaload_plan
    res = {"ok": True, "ranks": p.hardware["distributed"]["ranks"], "note": p.verified["ranks"],
           "phases": sorted(p.verified["phases"]), "explain": p.explain()}
except Exception as e:
    res = {"ok": False, "type": type(e).__name__, "msg": str(e), "fix": getattr(e, "fix", None)}
res["group_after"] = dist.is_initialized()
with open(f"{out}/rank{rank}.json", "w") as fh:
    json.dump(res, fh)
if dist.is_initialized():
    dist.destroy_process_group()
"""


def _torchrun(tmp: Path, model: Path, mode: str, timeout_s: str = "60") -> list[dict[str, Any]]:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "CUDALOAD_RANKS_TIMEOUT": timeout_s,
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    done = subprocess.run(
        [*cmd, str(script), str(model), str(tmp), mode], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_under_torchrun_the_ranks_agree_through_the_agents_store(tiny_model: Any, tmp_path: Path) -> None:
    res = _torchrun(tmp_path, tiny_model("qwen3"), "same")
    for x in res:
        assert x["ok"], x
        assert [r["rank"] for r in x["ranks"]] == [0, 1]
        assert "the 2 ranks planned from the same GPU facts (torchrun's store at" in x["note"]
        assert "ranks" in x["phases"]
        assert "ranks: the 2 ranks planned" in x["explain"]
        assert "Ranks: 2 on 1 host, no GPU each" in x["explain"]  # CPU ranks: not "None each"
        assert x["group_after"] is False  # no process group left behind for the user's own init
    assert res[0]["ranks"] == res[1]["ranks"]


@pytest.mark.slow
def test_under_torchrun_different_arguments_or_a_failed_rank_stop_every_rank(
    tiny_model: Any, tmp_path: Path
) -> None:
    path = tiny_model("qwen3")
    (tmp_path / "differ").mkdir()
    res = _torchrun(tmp_path / "differ", path, "differ")
    for x in res:
        assert not x["ok"] and x["type"] == "ConfigurationError", x
        assert "dtype: ranks 0 'float32'; ranks 1 'bfloat16'" in x["msg"]
        assert "same arguments on every rank" in x["fix"]
    (tmp_path / "fail").mkdir()
    res = _torchrun(tmp_path / "fail", path, "fail")
    assert res[1]["type"] != "LoadError" and not res[1]["ok"]  # the failing rank raises its own error
    assert res[0]["type"] == "LoadError" and "rank 1 could not plan" in res[0]["msg"], res[0]
    assert res[0]["fix"].startswith("on rank 1: use attn='auto'")


@pytest.mark.slow
def test_an_initialised_group_is_used_as_it_is(tiny_model: Any, tmp_path: Path) -> None:
    res = _torchrun(tmp_path, tiny_model("qwen3"), "group")
    for x in res:
        assert x["ok"], x
        assert "(the default process group's store)" in x["note"]
        assert x["group_after"] is True


@pytest.mark.slow
def test_a_rank_that_stops_before_or_between_the_exchanges_stops_the_others_at_once(
    tiny_model: Any, tmp_path: Path
) -> None:
    """A refused request (a bad variable) raises before the GPU exchange, an import between the two exchanges: the other
    rank used to wait CUDALOAD_RANKS_TIMEOUT for it, then plan alone and load (then hang in its first
    collective). With a timeout longer than torchrun's whole run here, it must stop with the rank's reason."""
    path = tiny_model("qwen3")
    for mode, why in (("broken", "ConfigurationError"), ("noimport", "")):
        (tmp_path / mode).mkdir()
        res = _torchrun(tmp_path / mode, path, mode, timeout_s="600")
        assert not res[1]["ok"] and res[1]["type"] != "LoadError", res[1]
        assert res[0]["type"] == "LoadError" and f"rank 1 could not plan ({why}" in res[0]["msg"], res[0]
        assert "on rank 1" in res[0]["fix"] or "see rank 1's error" in res[0]["fix"]


@pytest.mark.slow
def test_a_rank_that_planned_alone_is_not_waited_for_twice(tiny_model: Any, tmp_path: Path) -> None:
    res = _torchrun(tmp_path, tiny_model("qwen3"), "late", timeout_s="4")
    assert res[0]["ok"] and "not every rank published its GPU within 4 s: planned alone" in res[0]["note"]
    # the late rank found every GPU published and planned, then found rank 0's plan missing on purpose
    assert res[1]["ok"] and "the ranks' plans were not compared: rank 0 planned alone" in res[1]["note"], res[
        1
    ]


def test_a_rank_that_planned_alone_or_failed_is_named_not_a_key_error() -> None:
    from cudaload.policies.ranks import check_failed

    (c0, f0) = node(0, 60 * GiB, "a")
    p0 = plan(full_config("Qwen3-0.6B"), hardware=agree(c0, [f0, node(1, 60 * GiB, "b")[1]]), intent="lora")
    note = check_same(
        [{"alone": "not every rank's GPU was published within 5 s"}, {"decisions": decisions(p0)}]
    )
    assert note == (
        "the ranks' plans were not compared: rank 0 planned alone (not every rank's GPU was published within 5 s)"
    )
    assert check_same([{"decisions": decisions(p0)}, {"decisions": decisions(p0)}]) is None
    bad = {
        "error": "DeviceSelectionError: the GPUs this process may use are misconfigured",
        "fix": "use indices",
    }
    with pytest.raises(LoadError, match=r"rank 1 could not plan \(DeviceSelectionError") as e:
        check_failed([f0.to_dict(), bad])
    assert e.value.fix == "on rank 1: use indices (every rank stopped before loading anything)"


def test_a_store_that_closed_is_an_error_not_a_torch_traceback_from_the_except_clause() -> None:
    """The process hosting the store (rank 0 with an initialised group) exited: the wait fails at once and the
    check in its handler raised torch's DistNetworkError."""
    import gc
    from datetime import timedelta

    dist = pytest.importorskip("torch.distributed")
    from cudaload.detection.ranks import Rendezvous

    server = dist.TCPStore(
        "127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    client = dist.TCPStore("127.0.0.1", server.port, 2, is_master=False, timeout=timedelta(seconds=5))
    rv = Rendezvous(client, 1, 2, "cudaload/t/0/0", 30.0, "the default process group's store")
    del server
    gc.collect()
    with pytest.raises(
        LoadError, match=r"the default process group's store closed during load_model\(\)'s gpus"
    ):
        rv.exchange("gpus", {"rank": 1})
    # a rank that raises tells the others quietly: its own error is the one it raises, not the store's
    rv.tell("plans", {"error": "DoesNotFitError: no room"})


def test_no_store_or_no_wait_means_each_rank_plans_alone() -> None:
    from cudaload.detection.ranks import open_rendezvous

    rv, why = open_rendezvous(0, 2, env={"CUDALOAD_RANKS_TIMEOUT": "0"})
    assert rv is None and "CUDALOAD_RANKS_TIMEOUT=0" in why
    rv, why = open_rendezvous(0, 2, env={})
    assert rv is None and "no store to agree through" in why
    with pytest.raises(ConfigurationError, match="CUDALOAD_RANKS_TIMEOUT"):
        open_rendezvous(0, 2, env={"CUDALOAD_RANKS_TIMEOUT": "soon"})


def test_an_attention_that_differs_by_node_names_the_per_node_caches_and_attn() -> None:
    """With declared work, the attention choice reads the node's tune cache and FA4 compile cache: nodes with
    the same packages can differ there, and "give every node the same packages" alone sends the user astray."""
    (c0, f0) = node(0, 60 * GiB, "a")
    p0 = plan(full_config("Qwen3-0.6B"), hardware=agree(c0, [f0, node(1, 60 * GiB, "b")[1]]))
    d0 = decisions(p0)
    d1 = {**d0, "attention": "flash_attention_4"}
    with pytest.raises(ConfigurationError, match="attention: ranks 0 ") as e:
        check_same([{"decisions": d0}, {"decisions": d1}])
    assert "pass attn= explicitly, or share CUDALOAD_CACHE" in (e.value.fix or "")
    with pytest.raises(ConfigurationError) as e:
        check_same([{"decisions": d0}, {"decisions": {**d0, "dtype": "float16"}}])
    assert "attn=" not in (e.value.fix or "")


def test_a_model_one_rank_loads_alone_does_not_shift_the_later_rounds() -> None:
    """``if rank == 0: judge = load_model(...)`` under torchrun: rank 0's round for the judge finds nobody (it
    waits, then plans alone). With one counter for every call, rank 0's next call for the shared model was its
    round n+1 while the others' was round n: they never met again, each call waiting the whole timeout."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without torch.distributed")
    from cudaload.detection.ranks import model_key, open_rendezvous

    assert model_key("/data/ckpt/Qwen3-8B/") == model_key("Qwen/Qwen3-8B") == "Qwen3-8B"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        prefixes = []
        for m in ("/ckpt/policy", "/ckpt/judge", Path("/ckpt/policy")):
            rv, _ = open_rendezvous(0, 1, env={}, model=m)
            assert rv is not None
            prefixes.append(rv.prefix.split("/", 3)[3])
        base = int(prefixes[0].split("/")[1])
        assert prefixes[0] == f"policy/{base}" and prefixes[2] == f"policy/{base + 1}"
        assert prefixes[1].startswith("judge/")
    finally:
        dist.destroy_process_group()


def test_one_gpu_model_reported_a_few_mib_apart_is_not_different_gpus() -> None:
    """Two DGX Spark nodes: the GB10 reports the host's MemTotal (no separate GPU memory), which differs by the
    kernels' reservations; NVML's total of one discrete model also moves with the driver. Refused before as
    "different GPUs", with both described alike."""
    total = hardware("GB10").gpus[0].total_memory
    c0, f0 = node(0, total, "spark-a", profile="GB10")  # no free figure: facts() publishes the total
    _, f1 = node(1, total, "spark-b", profile="GB10")
    smaller = total - 37 * (1 << 20)
    f1 = dataclasses.replace(f1, free_memory=smaller, total_memory=smaller)
    agreed = agree(c0, [f0, f1])
    assert [r.rank for r in agreed.distributed.ranks] == [0, 1]
    # a real difference in memory is still refused, and says so
    (c2, g0), (_, g1) = node(0, 70 * GiB, "a"), node(1, 70 * GiB, "b")
    g1 = dataclasses.replace(g1, total_memory=96 * GiB)
    with pytest.raises(
        DeviceSelectionError, match=r"rank 0 \(a\): NVIDIA H200 \(sm90, 140 GiB\); rank 1 \(b\): "
    ):
        agree(c2, [g0, g1])


def test_the_exchange_returns_every_rank_in_rank_order_through_a_real_store() -> None:
    import threading

    dist = pytest.importorskip("torch.distributed")
    from cudaload.detection.ranks import Rendezvous

    store = dist.HashStore()
    out: dict[int, Any] = {}

    def rank(r: int) -> None:
        out[r] = Rendezvous(store, r, 3, "cudaload/t/0/m/0", 30.0, "a test store").exchange(
            "gpus", {"rank": r}
        )

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0] == out[1] == out[2] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]


def test_a_rank_that_raises_waits_at_most_a_minute_for_the_others_to_read_its_error() -> None:
    """Before the GPU exchange a rank with a broken GPU selection used to raise at once; telling the others
    must not hold its own error for the whole CUDALOAD_RANKS_TIMEOUT when a peer never comes."""
    import time

    dist = pytest.importorskip("torch.distributed")
    from cudaload.detection import ranks as detection_ranks

    store = dist.HashStore()
    rv = detection_ranks.Rendezvous(store, 0, 2, "cudaload/t/0/m/0", 3600.0, "a test store")
    old = detection_ranks.TELL_WAIT_S
    detection_ranks.TELL_WAIT_S = 0.5  # the cap, shortened for the test
    try:
        t0 = time.monotonic()
        rv.tell("gpus", {"error": "DeviceSelectionError: bad"})
        assert time.monotonic() - t0 < 30
    finally:
        detection_ranks.TELL_WAIT_S = old
    assert json.loads(store.get("cudaload/t/0/m/0/gpus/0")) == {"error": "DeviceSelectionError: bad"}


def test_every_rank_plans_for_the_smallest_nodes_host_memory() -> None:
    (c0, _), (c1, _) = node(0, 140 * GiB, "a"), node(1, 140 * GiB, "b")
    c0 = dataclasses.replace(c0, host_memory=2048 * GiB)
    c1 = dataclasses.replace(c1, host_memory=256 * GiB)
    f0, f1 = facts(c0, "a"), facts(c1, "b")
    assert (f0.host_memory, f1.host_memory) == (2048 * GiB, 256 * GiB)
    plans = [
        plan(full_config("Qwen3-8B"), hardware=agree(c, [f0, f1]), intent="training", allow_offload=True)
        for c in (c0, c1)
    ]
    assert [p.hardware["host_memory"] for p in plans] == [256 * GiB, 256 * GiB]
    assert plans[0].to_dict()["parallelism"] == plans[1].to_dict()["parallelism"]
    check_same([{"decisions": decisions(p)} for p in plans])
    # the facts travel in the JSON, older records without the field still read
    again = Capabilities.from_json(agree(c1, [f0, f1]).to_json())
    assert again.distributed.ranks[0].host_memory == 2048 * GiB
    old = f0.to_dict()
    del old["host_memory"]
    assert RankGPU.from_dict(old).host_memory is None


def test_a_rank_left_waiting_says_who_is_missing_and_how_to_stop_waiting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A script that loads a model on rank 0 only would otherwise sit silent for CUDALOAD_RANKS_TIMEOUT."""
    import logging

    dist = pytest.importorskip("torch.distributed")
    from cudaload.detection import ranks as detection_ranks

    store = dist.HashStore()
    old = detection_ranks.NOTICE_S
    detection_ranks.NOTICE_S = 0.3
    try:
        with caplog.at_level(logging.WARNING, logger="cudaload"):
            got = detection_ranks.Rendezvous(store, 0, 2, "cudaload/t/0/m/0", 1.0, "a test store").exchange(
                "gpus", {"rank": 0}
            )
    finally:
        detection_ranks.NOTICE_S = old
    assert got is None
    msgs = [r.getMessage() for r in caplog.records]
    assert any(
        "rank 0 waits up to 1 s more for ranks [1]" in m and "CUDALOAD_RANKS_TIMEOUT=0" in m for m in msgs
    )
    assert any("ranks [1] did not reach load_model()'s gpus exchange within 1 s" in m for m in msgs)

    # a rank that arrives within the notice time: no notice
    caplog.clear()
    import threading

    late = threading.Timer(
        0.1,
        lambda: detection_ranks.Rendezvous(store, 1, 2, "cudaload/t/0/m/1", 5.0, "s").publish(
            "gpus", {"rank": 1}
        ),
    )
    late.start()
    with caplog.at_level(logging.WARNING, logger="cudaload"):
        got = detection_ranks.Rendezvous(store, 0, 2, "cudaload/t/0/m/1", 5.0, "a test store").exchange(
            "gpus", {"rank": 0}
        )
    late.join()
    assert got == [{"rank": 0}, {"rank": 1}] and not caplog.records
