"""The ranks of a torchrun launch tell each other what they saw, through torchrun's own key-value store.

No process group is started for this (a user's later ``init_process_group`` would then fail: "trying to
initialize the default process group twice"), and no GPU is touched. The store is:

- the default group's store when the user already initialised one (``distributed_c10d._get_default_store``);
- else the store torchrun's agent hosts at MASTER_ADDR:MASTER_PORT, which its workers join as clients when
  ``TORCHELASTIC_USE_AGENT_STORE=True`` (torch 2.13 distributed/rendezvous.py:188-196; the agent sets it,
  elastic/agent/server/local_elastic_agent.py:405-429);
- else none: the rank plans alone, and the plan says so.

Each ``load_model()`` call is one round: every rank writes its value under ``cudaload/<run>/<restart>/<model>/
<call>/<stage>/<rank>`` and waits (at most ``CUDALOAD_RANKS_TIMEOUT`` seconds) for every other rank's. ``<call>``
counts this process's calls for that model (the checkpoint's directory or repo name), so that a model one rank
loads alone (``if rank == 0: judge = load_model(...)``: it waits, then plans alone) does not shift every later
call of the ranks onto keys the others never write.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .. import _env
from ..errors import LoadError

logger = logging.getLogger("cudaload")

#: load_model() calls in this process, per model: the n-th call of every rank for a model meets the n-th call
#: of the others for it
_CALLS: dict[str, itertools.count[int]] = {}


#: the longest a rank that raises waits for the others to have found its error (its own error waits meanwhile)
TELL_WAIT_S = 60.0
#: After this long waiting for other ranks, say who is missing and how to stop waiting (a script that loads a
#: model on rank 0 only would otherwise sit silent for the whole CUDALOAD_RANKS_TIMEOUT)
NOTICE_S = 15.0


class Rendezvous:
    """One load_model() call's exchanges with the other ranks."""

    def __init__(self, store: Any, rank: int, world: int, prefix: str, timeout_s: float, how: str) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.how = how

    def publish(self, stage: str, value: Mapping[str, Any]) -> None:
        """Publish ``value`` without waiting for the others (a rank that will not wait for this stage)."""
        self.store.set(f"{self.prefix}/{stage}/{self.rank}", json.dumps(value))

    def tell(self, stage: str, value: Mapping[str, Any]) -> None:
        """Publish this rank's error in ``stage`` instead of what it would have published, and wait (quietly, at
        most TELL_WAIT_S) until every rank has published there too: they find the error there as soon as they
        arrive, before this rank exits (taking with it the store, when it hosts the default group's; a rank that
        comes later then meets a closed store, also an error)."""
        keys = [f"{self.prefix}/{stage}/{r}" for r in range(self.world)]
        with contextlib.suppress(Exception):  # this rank raises its own error anyway, not the store's
            self.publish(stage, value)
            self.store.wait(keys, timedelta(seconds=min(self.timeout_s, TELL_WAIT_S)))

    def _missing(self, keys: list[str], stage: str, e: Exception) -> list[int]:
        """The ranks that have not published yet, after a wait ended by ``e``; LoadError when the store is gone."""
        try:
            return [r for r in range(self.world) if not self.store.check([keys[r]])]
        except Exception as gone:
            # not a timeout: the store closed (the process or agent hosting it exited, e.g. a rank that
            # raised); torch raises DistNetworkError here ("Connection was likely closed")
            raise LoadError(
                f"{self.how} closed during load_model()'s {stage} exchange ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}; then {type(gone).__name__})",
                fix="see the other ranks' errors: the rank (or torchrun agent) hosting the store exited",
            ) from None

    def exchange(self, stage: str, value: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Publish ``value`` and return every rank's, in rank order; None when a rank did not publish in time
        (the caller goes on alone and says so). Raises LoadError when the store itself went away."""
        key = f"{self.prefix}/{stage}"
        self.publish(stage, value)
        keys = [f"{key}/{r}" for r in range(self.world)]
        first = min(NOTICE_S, self.timeout_s)
        for wait_s in (first, self.timeout_s - first):
            if wait_s <= 0:
                continue
            try:
                self.store.wait(keys, timedelta(seconds=wait_s))
                break
            except Exception as e:  # torch raises DistStoreError (a RuntimeError) on timeout
                missing = self._missing(keys, stage, e)
                if wait_s == first and self.timeout_s > first:
                    logger.warning(
                        "cudaload: rank %d waits up to %.0f s more for ranks %s to reach load_model() (the %s "
                        "exchange, so that every rank plans alike); if only some ranks load this model, set "
                        "CUDALOAD_RANKS_TIMEOUT=0 for this script",
                        self.rank,
                        self.timeout_s - first,
                        missing,
                        stage,
                    )
                    continue
                logger.warning(
                    "cudaload: ranks %s did not reach load_model()'s %s exchange within %.0f s (%s); rank %d "
                    "plans alone",
                    missing,
                    stage,
                    self.timeout_s,
                    type(e).__name__,
                    self.rank,
                )
                return None
        try:
            # one request, not one per rank: every rank reads every rank's value, world^2 requests to one store
            raw = self.store.multi_get(keys)
        except Exception:  # a store without multi_get
            raw = [self.store.get(k) for k in keys]
        return [json.loads(v) for v in raw]


def model_key(model: str | os.PathLike[str]) -> str:
    """The name a model's rounds are counted under: the last part of its path or repo id, alike on every node
    ("/data/ckpt/Qwen3-8B/" and "Qwen/Qwen3-8B" are both "Qwen3-8B")."""
    return os.path.basename(os.fspath(model).rstrip("/\\")) or "model"


def open_rendezvous(
    rank: int, world: int, env: Mapping[str, str] | None = None, model: str | os.PathLike[str] = ""
) -> tuple[Rendezvous | None, str]:
    """The rendezvous for this load_model() call of ``model`` and how it was found, or None and why not."""
    timeout = _env.ranks_timeout(env)
    name = model_key(model)
    call = next(_CALLS.setdefault(name, itertools.count()))
    if timeout == 0:
        return None, "CUDALOAD_RANKS_TIMEOUT=0: each rank planned alone"
    te = _env.torchelastic(env)
    # a restarted job (torchrun --max-restarts) must not read the keys of the attempt before it
    prefix = f"cudaload/{te.get('TORCHELASTIC_RUN_ID', 'run')}/{te.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}/{call}"
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from torch.distributed.distributed_c10d import _get_default_store

        return (
            Rendezvous(
                _get_default_store(), rank, world, prefix, timeout, "the default process group's store"
            ),
            "",
        )
    if te.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "MASTER_ADDR" in te and "MASTER_PORT" in te:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C

        try:
            store = TCPStore(
                te["MASTER_ADDR"],
                int(te["MASTER_PORT"]),
                world,
                is_master=False,
                timeout=timedelta(seconds=max(timeout, 1.0)),
            )
        except Exception as e:  # an agent store that cannot be reached: plan alone, say why
            return (
                None,
                f"torchrun's store at {te['MASTER_ADDR']}:{te['MASTER_PORT']} was not reachable ({e})",
            )
        where = f"torchrun's store at {te['MASTER_ADDR']}:{te['MASTER_PORT']}"
        return Rendezvous(store, rank, world, prefix, timeout, where), ""
    return None, (
        "no store to agree through (no process group initialised and not under torchrun's agent): each rank "
        "planned from its own GPU"
    )


def host() -> str:
    return socket.gethostname()
