"""The connector's scheduler side asks the store only where the conductor's plan has the store
add to what vLLM's own cache holds (pure logic: a recorded bridge stands in for the store)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

from vllm.v1.core.sched.output import SchedulerOutput

from crescent.engine.vllm import scheduler_side
from crescent.engine.vllm.plan import PARAM_PLANNED, PARAM_SAVE_TO, ConnectorConfig
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.engine.vllm.scheduler_side import SchedulerSide

BLOCK = 64
STORED_BLOCKS = 16


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict = field(default_factory=dict)


class _Ops:
    def lookup(self, node: str, hashes: list[bytes], wait_writing_s: float) -> int:
        return min(len(hashes), STORED_BLOCKS)  # what the bridge's future resolves to


class _Bridge:
    """Runs each lookup at once, recording it, as the store would answer."""

    def __init__(self) -> None:
        self.asked = 0

    def submit(self, blocks_held: int) -> concurrent.futures.Future[int]:
        self.asked += 1
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        future.set_result(blocks_held)
        return future


def _side() -> tuple[SchedulerSide, _Bridge]:
    config = ConnectorConfig(
        nats_url="", etcd_url="", cluster="c", node="n", model="m", block_size=BLOCK
    )
    bridge = _Bridge()
    runtime = ConnectorRuntime(config, bridge, _Ops(), None, None, 16, BLOCK // 16)
    return SchedulerSide(runtime), bridge


def _request(planned: int | None) -> _Request:
    params = {} if planned is None else {PARAM_PLANNED: planned}
    return _Request("r", list(range(2000)), params)


def _matched(side: SchedulerSide, request: _Request, num_computed: int) -> int | None:
    """vLLM's question, asked again as at its next step until the answer is known."""
    for _ in range(2):
        num_tokens, _ = side.num_new_matched_tokens(request, num_computed)
        if num_tokens is not None:
            return num_tokens
    raise AssertionError("the answer never came")


@pytest.mark.parametrize("num_computed", [0, 512, 1024])
def test_a_plan_covered_by_vllms_own_cache_asks_the_store_nothing(num_computed):
    side, bridge = _side()
    assert _matched(side, _request(planned=num_computed), num_computed) == 0
    assert bridge.asked == 0


def test_a_plan_beyond_vllms_cache_asks_the_store_and_loads_what_it_holds():
    side, bridge = _side()
    assert _matched(side, _request(planned=1024), 512) == STORED_BLOCKS * BLOCK - 512
    assert bridge.asked == 1


def test_a_job_with_no_plan_always_asks_the_store():
    side, bridge = _side()
    assert _matched(side, _request(planned=None), 0) == STORED_BLOCKS * BLOCK
    assert bridge.asked == 1


def test_a_prompt_is_hashed_once_for_its_lookup_load_and_saves(monkeypatch):
    """Lookup, load and save planning all need the prompt's block hashes on the scheduler's
    thread: they are computed once per request, and forgotten with it."""
    calls = []
    real = scheduler_side.block_hashes
    monkeypatch.setattr(
        scheduler_side, "block_hashes", lambda *args: calls.append(1) or real(*args)
    )
    side, _ = _side()
    request = _request(planned=None)
    request.kv_transfer_params[PARAM_SAVE_TO] = ["n"]
    num_tokens = _matched(side, request, 0)
    side.after_alloc(request, list(range(len(request.prompt_token_ids) // 16 + 1)), num_tokens)
    assert side.build_meta(SchedulerOutput.make_empty()).loads and len(calls) == 1
    side.forget(request.request_id)
    _matched(side, request, 0)
    assert len(calls) == 2
