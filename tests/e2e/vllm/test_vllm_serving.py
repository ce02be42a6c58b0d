"""The vllm engine end to end: tiny Llama on the CPU build, float32, greedy; prefill and decode
workers as processes with CrescentConnector moving KV through the node stores."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import pytest
from vllm_helpers import BLOCK_SIZE, CLUSTER, MODEL, prompt_tokens, reference_tokens

from crescent.common.errors import RemoteError
from crescent.common.hashing import block_hashes
from crescent.common.messages import InstanceLoad, PrefillJob, PrefillResult
from crescent.common.naming import Subjects
from crescent.common.store_messages import LookupBlocks, LookupReply

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]

LENGTHS = [50, 130, 257, 400, 700, 1000, 1500, 2000]
MAX_TOKENS = 12


async def wait_for_events(
    cluster, instance_id: str, request_id: str, event: str, nodes: set[str], timeout_s: float = 30
) -> dict[str, dict]:
    """The first `event` of the request per node, once every node in `nodes` has one
    (saves finish beside the request path)."""
    deadline = time.monotonic() + timeout_s
    while True:
        by_node = {}
        for e in events_of(cluster, instance_id, request_id, event):
            by_node.setdefault(e["node"], e)
        if nodes <= by_node.keys():
            return by_node
        assert time.monotonic() < deadline, (
            f"{event} on {nodes - by_node.keys()} missing after {timeout_s}s"
        )
        await asyncio.sleep(0.1)


def events_of(cluster, instance_id: str, request_id: str, event: str) -> list[dict]:
    """vLLM suffixes request ids internally: match `<request_id>-…`."""
    return [
        e
        for e in cluster.events(instance_id)
        if e["event"] == event and e["request"].startswith(f"{request_id}-")
    ]


async def test_disaggregated_1p1d_equals_plain_vllm_token_for_token(
    vllm_cluster, conductor, reference
):
    prompts = [prompt_tokens(n, seed=i) for i, n in enumerate(LENGTHS)]
    expected = reference_tokens(reference, prompts, MAX_TOKENS)
    results = await asyncio.gather(*(conductor.generate(p, MAX_TOKENS) for p in prompts))

    for prompt, want, (got, prefill) in zip(prompts, expected, results):
        assert got == want, f"{len(prompt)}-token prompt diverged"
        assert prefill.num_computed_tokens == len(prompt)  # fresh prompts: nothing to reuse
        # decode loaded every full block of the prompt from its node's store, copied in place
        # from the store's segment, which is mapped on this host
        full_blocks = len(prompt) // BLOCK_SIZE
        loads = events_of(vllm_cluster, "decode-A", prefill.request_id, "load")
        assert [(e["num_loaded"], e["num_blocks"], e["route"], e["error"]) for e in loads] == (
            [(full_blocks, full_blocks, "mapped", None)] if full_blocks else []
        )


def test_each_engine_core_holds_one_data_plane_bridge_and_a_lookup_connection(vllm_cluster):
    """vLLM builds CrescentConnector once per role. One data-plane bridge (`<node>-<role>-kv`)
    per engine, whichever way vLLM lays out its processes: when its worker runs in a process of
    its own, the scheduler side adds a NATS connection for lookups alone (`…-kv-lookup`: no etcd
    client, no staging segment); when both roles share a process, they share the one bridge."""
    data_plane = ["A-decode-kv", "A-decode-kv", "A-decode-kv", "A-prefill-kv", "B-prefill-kv"]
    deadline = time.monotonic() + 30
    while True:  # bridges connect as the engines start: read until the names settle
        names = vllm_cluster.nats_connection_names()
        bridges = sorted(name for name in names if name.endswith("-kv"))
        lookups = sorted(name for name in names if name.endswith("-kv-lookup"))
        if bridges == data_plane or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert bridges == data_plane, names
    assert lookups in ([], [f"{name}-lookup" for name in data_plane]), names


async def test_decode_telemetry_reports_vllm_batch_and_kv_usage(vllm_cluster, conductor):
    telemetry: list[InstanceLoad] = []
    await conductor.bus.subscribe(
        Subjects(CLUSTER).telemetry("decode", "decode-A"), InstanceLoad, telemetry.append
    )
    await asyncio.gather(
        *(conductor.generate(prompt_tokens(300, seed=600 + i), 150) for i in range(3))
    )
    busy = [load for load in telemetry if load.num_running >= 1]
    assert busy, "decode telemetry never showed vLLM's running batch"
    assert all(load.kv_used_tokens > 0 and load.num_context_tokens > 0 for load in busy)
    assert max(load.num_running for load in busy) >= 2  # the three generations overlap in one batch
    assert telemetry[0].kv_capacity_tokens > 0


async def test_shared_prefix_is_loaded_from_the_store_not_recomputed(
    vllm_cluster, conductor, reference
):
    prefix = prompt_tokens(1024, seed=100)
    first, second = prefix + prompt_tokens(100, seed=101), prefix + prompt_tokens(130, seed=102)
    expected = reference_tokens(reference, [first, second], MAX_TOKENS)

    got_first, _ = await conductor.generate(first, MAX_TOKENS)
    got_second, prefill = await conductor.generate(second, MAX_TOKENS)

    assert [got_first, got_second] == expected
    # prefill-A has vLLM's own prefix cache off: the 16 prefix blocks came from store-A
    assert prefill.num_computed_tokens <= len(second) - len(prefix) + BLOCK_SIZE
    [load] = events_of(vllm_cluster, "prefill-A", prefill.request_id, "load")
    assert load["num_loaded"] >= len(prefix) // BLOCK_SIZE


async def test_a_prefix_the_plan_does_not_count_on_is_computed_not_looked_up(
    vllm_cluster, conductor, reference
):
    """The conductor's plan bounds what the connector asks the store for: with a plan of no
    stored prefix, prefill-A (vLLM's own cache off) computes the whole prompt although store A
    holds its prefix; with the prefix planned, it loads it. Both answer as plain vLLM does."""
    prefix = prompt_tokens(1024, seed=110)
    first, unplanned, planned = (prefix + prompt_tokens(100 + i, seed=111 + i) for i in range(3))
    expected = reference_tokens(reference, [first, unplanned, planned], MAX_TOKENS)

    got_first, _ = await conductor.generate(first, MAX_TOKENS)
    got_unplanned, computed = await conductor.generate(unplanned, MAX_TOKENS, planned=0)
    got_planned, loaded = await conductor.generate(planned, MAX_TOKENS, planned=len(prefix))

    assert [got_first, got_unplanned, got_planned] == expected
    assert computed.num_cached_tokens == 0 and computed.num_computed_tokens == len(unplanned)
    assert not events_of(vllm_cluster, "prefill-A", computed.request_id, "load")
    assert loaded.num_cached_tokens == len(prefix)


async def test_blocks_every_target_store_holds_are_not_snapshotted_again(
    vllm_cluster, conductor, reference
):
    """The second prompt's step plans every full block for store A, which already holds the
    shared prefix: the forward pass gathers only the new blocks, and the output is unchanged."""
    prefix = prompt_tokens(1024, seed=150)
    first, second = prefix + prompt_tokens(90, seed=151), prefix + prompt_tokens(700, seed=152)
    expected = reference_tokens(reference, [first, second], MAX_TOKENS)

    got_first, _ = await conductor.generate(first, MAX_TOKENS)
    got_second, prefill = await conductor.generate(second, MAX_TOKENS)

    assert [got_first, got_second] == expected
    computed = events_of(vllm_cluster, "prefill-A", prefill.request_id, "computed")
    new_blocks = len(second) // BLOCK_SIZE - len(prefix) // BLOCK_SIZE
    # a layer finished before store A answered the allocation snapshots every block
    assert min(e["num_snapshotted"] for e in computed) == new_blocks
    committed = await wait_for_events(
        vllm_cluster, "prefill-A", prefill.request_id, "committed", {"A"}
    )
    assert (committed["A"]["num_blocks"], committed["A"]["num_existing"]) == (
        new_blocks,
        len(prefix) // BLOCK_SIZE,
    )


async def test_conditional_disaggregation_decode_computes_the_prompt_as_plain_vllm_would(
    vllm_cluster, conductor, reference
):
    """No prefill job: the decode instance computes a fresh prompt (0 % cached), and a prompt
    whose 768-token prefix its node's store holds (90 % cached) loading that prefix and
    computing the rest; both outputs equal plain vLLM's, and the blocks it computed are saved
    to its node's store for the next request."""
    prefix = prompt_tokens(768, seed=300)
    cold, warm = prompt_tokens(90, seed=301), prefix + prompt_tokens(85, seed=302)
    expected = reference_tokens(reference, [cold, warm], MAX_TOKENS)
    await conductor.prefill("prefill-A", prefix + [1])  # the prefix's blocks into store-A

    got_cold, cold_id = await conductor.generate_on_decode(cold, MAX_TOKENS)
    got_warm, warm_id = await conductor.generate_on_decode(warm, MAX_TOKENS)

    assert [got_cold, got_warm] == expected
    assert all(e["num_loaded"] == 0 for e in events_of(vllm_cluster, "decode-A", cold_id, "load"))
    [warm_load] = events_of(vllm_cluster, "decode-A", warm_id, "load")
    assert warm_load["num_loaded"] == len(prefix) // BLOCK_SIZE and warm_load["error"] is None
    committed = await wait_for_events(vllm_cluster, "decode-A", cold_id, "committed", {"A"})
    assert committed["A"]["num_blocks"] == len(cold) // BLOCK_SIZE


async def test_a_prompt_computed_on_decode_answers_before_its_blocks_are_committed(
    vllm_cluster, conductor, reference
):
    """decode-A computes a prompt itself (conditional disaggregation) and saves its blocks to
    its node's store for later reuse, each commit held 0.5 s by its fault: its first token
    waits for none of them. A slow store would otherwise hold every running stream's step."""
    prompt = prompt_tokens(600, seed=310)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)
    arrivals: list[float] = []

    got, request_id = await conductor.generate_on_decode(prompt, MAX_TOKENS, arrivals=arrivals)

    assert got == want
    committed = await wait_for_events(vllm_cluster, "decode-A", request_id, "committed", {"A"})
    assert arrivals[0] < committed["A"]["t"]


async def test_prefill_on_node_b_computes_a_prefix_held_only_on_node_a_when_no_pull_is_planned(
    vllm_cluster, conductor, reference
):
    """The connector never picks a source itself: without a planned pull, node A's copy of the
    prefix is not fetched; prefill-B computes the whole prompt and B's store pulls nothing."""
    prefix = prompt_tokens(768, seed=210)
    on_a, on_b = prefix + prompt_tokens(70, seed=211), prefix + prompt_tokens(90, seed=212)
    [want] = reference_tokens(reference, [on_b], MAX_TOKENS)
    await conductor.prefill("prefill-A", on_a)
    pulled_before = vllm_cluster.metric(
        "store-B", "crescent_store_replications_total", reason="on-demand", outcome="ok"
    )

    got, prefill = await conductor.generate(on_b, MAX_TOKENS, prefill_id="prefill-B")

    assert got == want
    assert prefill.num_cached_tokens == 0 and prefill.num_computed_tokens == len(on_b)
    assert not events_of(vllm_cluster, "prefill-B", prefill.request_id, "load")
    assert (
        vllm_cluster.metric(
            "store-B", "crescent_store_replications_total", reason="on-demand", outcome="ok"
        )
        == pulled_before
    )


async def test_prefill_on_node_b_reuses_node_a_prefix_through_the_planned_pull_over_tcp(
    vllm_cluster, conductor, reference
):
    """The conductor's plan names the source: B's store pulls those blocks from A's store;
    prefill-B runs tcp alone: it reads them from B's store and writes its new blocks to A's and
    B's stores, all over tcp, as the transport counters of the connector (event log) and of both
    stores (/metrics) show."""
    prefix = prompt_tokens(768, seed=200)
    on_a, on_b = prefix + prompt_tokens(70, seed=201), prefix + prompt_tokens(90, seed=202)
    expected = reference_tokens(reference, [on_a, on_b], MAX_TOKENS)
    prefix_hashes = block_hashes(prefix, BLOCK_SIZE, MODEL)
    pulled_before = vllm_cluster.metric(
        "store-B", "crescent_store_replicated_blocks_total", reason="on-demand", source="A"
    )

    got_a, _ = await conductor.generate(on_a, MAX_TOKENS, prefill_id="prefill-A")
    served_by_a = vllm_cluster.transfer_bytes("store-A").get(("tcp", "served"), 0)
    got_b, prefill = await conductor.generate(
        on_b, MAX_TOKENS, prefill_id="prefill-B", pull=("A", prefix_hashes)
    )

    assert [got_a, got_b] == expected
    assert prefill.num_cached_tokens == len(prefix)
    assert vllm_cluster.metric(
        "store-B", "crescent_store_replicated_blocks_total", reason="on-demand", source="A"
    ) == pulled_before + len(prefix_hashes)
    [load] = events_of(vllm_cluster, "prefill-B", prefill.request_id, "load")
    assert load["num_loaded"] == len(prefix_hashes) and load["error"] is None
    assert load["route"] == "data-plane"
    committed = await wait_for_events(
        vllm_cluster, "prefill-B", prefill.request_id, "committed", {"A", "B"}
    )
    stored = events_of(vllm_cluster, "prefill-B", prefill.request_id, "stored")
    assert {(e["node"], e["layer"]) for e in stored} >= {("A", 0), ("A", 1), ("B", 0), ("B", 1)}
    # the bytes took tcp: the prefix pulled into B, the prefix read from B, the new blocks to A
    # and B
    prefix_bytes = len(prefix) // BLOCK_SIZE * vllm_cluster.block_bytes
    new_bytes = committed["A"]["num_blocks"] * vllm_cluster.block_bytes
    moved = max((e for e in committed.values()), key=lambda e: e["t"])["moved"]
    assert set(moved) == {"tcp"} and moved["tcp"] >= prefix_bytes + 2 * new_bytes
    on_b_store = vllm_cluster.transfer_bytes("store-B")
    assert {transport for transport, _ in on_b_store} == {"tcp"}
    assert on_b_store[("tcp", "client")] >= prefix_bytes
    assert (
        vllm_cluster.transfer_bytes("store-A")[("tcp", "served")] - served_by_a
        >= prefix_bytes + new_bytes
    )


async def test_the_first_token_waits_for_no_commit_and_decode_for_its_nodes(
    vllm_cluster, conductor, reference
):
    """prefill-B saves to A (decode-A's node) and to B (its own), every commit held 0.5 s by
    its fault: the prefill answers before either store has committed, and decode-A's lookup
    waits in A's store for the blocks still being written, so it loads every one."""
    prompt = prompt_tokens(600, seed=250)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)

    got, prefill = await conductor.generate(prompt, MAX_TOKENS, prefill_id="prefill-B")

    assert got == want
    full_blocks = len(prompt) // BLOCK_SIZE
    [load] = events_of(vllm_cluster, "decode-A", prefill.request_id, "load")
    assert (load["num_loaded"], load["num_blocks"]) == (full_blocks, full_blocks)
    committed = await wait_for_events(
        vllm_cluster, "prefill-B", prefill.request_id, "committed", {"A", "B"}
    )
    assert min(committed["A"]["t"], committed["B"]["t"]) > conductor.prefilled_at


async def test_a_store_that_stops_answering_holds_no_step_past_the_engines_wait(
    vllm_cluster, conductor, reference
):
    """store-A stops (SIGSTOP) with requests of prefill-A and decode-A under way: their
    lookups and the commit before the first token get no answer. Each holds the engine for at
    most --kv-engine-wait-s (2 s), not --kv-timeout-s (10 s): the prefill computes the prompt,
    its first token goes out without the commit, the decode computes what it lacks, and the
    answer is plain vLLM's. With the engine waiting out the store's deadline, the three waits
    alone would take 30 s."""
    prompt = prompt_tokens(600, seed=270)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)
    store = vllm_cluster.processes["store-A"]
    store.signal(signal.SIGSTOP)
    try:
        got, _ = await asyncio.wait_for(conductor.generate(prompt, MAX_TOKENS), 20)
    finally:
        store.signal(signal.SIGCONT)
    assert got == want


async def test_block_lost_while_loading_is_recomputed_correctly(vllm_cluster, conductor, reference):
    prompt = prompt_tokens(900, seed=350)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)

    got, prefill = await conductor.generate(prompt, MAX_TOKENS, decode_id="decode-F")

    assert got == want
    [load] = events_of(vllm_cluster, "decode-F", prefill.request_id, "load")
    assert (
        load["num_blocks"] == len(prompt) // BLOCK_SIZE and load["num_loaded"] == 1
    )  # block 1 was evicted


async def test_a_block_lost_while_loading_is_not_counted_as_cached(
    vllm_cluster, conductor, reference
):
    """decode-F's store loses block 1 of the prefix between the lookup and the load, so vLLM
    computes from block 1 on: the decode reports one block's tokens as cached (what the usage's
    cached tokens and the hit rate count), not the whole prefix it looked up."""
    prefix = prompt_tokens(768, seed=360)
    prompt = prefix + prompt_tokens(50, seed=361)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)
    await conductor.prefill("prefill-A", prefix + [1])  # the prefix's blocks into store-A

    got, request_id = await conductor.generate_on_decode(prompt, MAX_TOKENS, decode_id="decode-F")

    assert got == want
    [load] = events_of(vllm_cluster, "decode-F", request_id, "load")
    assert load["num_blocks"] == len(prefix) // BLOCK_SIZE and load["num_loaded"] == 1
    assert conductor.num_cached_tokens[request_id] == BLOCK_SIZE


async def decoding(conductor, seed: int, decode_id: str) -> tuple[asyncio.Task, list[float]]:
    """A 1,000-token request decoding on `decode_id` (its 50-token prompt computed there), once
    it has 20 tokens: its task and the wall-clock arrival of each of its tokens."""
    arrivals: list[float] = []
    running = asyncio.create_task(
        conductor.generate_on_decode(
            prompt_tokens(50, seed=seed), 1000, decode_id=decode_id, arrivals=arrivals
        )
    )
    deadline = time.monotonic() + 60
    while len(arrivals) < 20:
        assert time.monotonic() < deadline and not running.done(), "the running request stalled"
        await asyncio.sleep(0.01)
    return running, arrivals


async def test_a_decode_steps_its_running_requests_while_a_new_one_loads(
    vllm_cluster, conductor, reference
):
    """decode-S starts every load 2 s late (kv_fault slow_load). A request already decoding
    there goes on getting tokens while a new request's prefix is read from the store, because
    the decode loads asynchronously: the new request waits, no step does. (With
    --no-kv-load-async the load runs inside a step, and the running request gets a token or
    two in those 2 s.)"""
    running, arrivals = await decoding(conductor, seed=600, decode_id="decode-S")
    prompt = prompt_tokens(700, seed=601)
    [want] = reference_tokens(reference, [prompt], 2)

    got, prefill = await conductor.generate(prompt, 2, decode_id="decode-S")
    loaded_at = time.time()

    assert got == want
    [load] = events_of(vllm_cluster, "decode-S", prefill.request_id, "load")
    assert (load["is_async"], load["num_loaded"], load["error"]) == (
        True,
        len(prompt) // BLOCK_SIZE,
        None,
    )
    during_load = [t for t in arrivals if conductor.prefilled_at < t < loaded_at]
    assert len(during_load) >= 20, f"{len(during_load)} tokens of the running request"
    tokens, _ = await running
    assert len(tokens) == 1000


async def test_a_decode_steps_its_running_requests_while_the_store_does_not_answer(
    vllm_cluster, conductor, reference
):
    """store-A stops (SIGSTOP) while a request decodes on decode-A and a new one arrives there
    (a prompt it computes itself). The new request's lookup gets no answer for
    --kv-engine-wait-s (2 s), and meanwhile decode-A steps the running request on, because the
    lookup runs beside the steps; then the new prompt is computed and answered as plain vLLM
    would. (With the lookup inside a step, the running request got no token in those 2 s.)"""
    running, arrivals = await decoding(conductor, seed=610, decode_id="decode-A")
    prompt = prompt_tokens(600, seed=611)
    [want] = reference_tokens(reference, [prompt], 2)
    new_arrivals: list[float] = []
    store = vllm_cluster.processes["store-A"]
    store.signal(signal.SIGSTOP)
    try:
        sent_at = time.time()
        got, _ = await asyncio.wait_for(
            conductor.generate_on_decode(prompt, 2, arrivals=new_arrivals), 20
        )
    finally:
        store.signal(signal.SIGCONT)

    assert got == want
    # the heart of the lookup's wait: from 0.5 s after the request went out to 0.5 s before
    # its first token (computed once the lookup is given up, ~2 s in)
    during_lookup = [t for t in arrivals if sent_at + 0.5 < t < new_arrivals[0] - 0.5]
    assert len(during_lookup) >= 20, f"{len(during_lookup)} tokens of the running request"
    tokens, _ = await running
    assert len(tokens) == 1000


async def test_kv_reaches_the_decode_store_layer_by_layer(vllm_cluster, conductor):
    prompt = prompt_tokens(2000, seed=400)
    _, prefill = await conductor.generate(prompt, 2)

    stored = events_of(vllm_cluster, "prefill-A", prefill.request_id, "stored")
    computed = events_of(vllm_cluster, "prefill-A", prefill.request_id, "computed")
    last_step = max(e["step"] for e in computed)
    last_layer = max(e["layer"] for e in computed)
    last_layer_done = next(
        e["t"] for e in computed if e["step"] == last_step and e["layer"] == last_layer
    )
    first_layer_stored = next(
        e["t"] for e in stored if e["step"] == last_step and e["layer"] == 0 and e["node"] == "A"
    )
    assert first_layer_stored < last_layer_done
    assert {e["layer"] for e in stored if e["step"] == last_step} == set(range(last_layer + 1))
    deadline = time.monotonic() + 30  # commits finish beside the request path
    while True:
        committed = events_of(vllm_cluster, "prefill-A", prefill.request_id, "committed")
        if sum(e["num_blocks"] + e["num_existing"] for e in committed) >= len(prompt) // BLOCK_SIZE:
            break
        assert time.monotonic() < deadline, committed
        await asyncio.sleep(0.1)


async def test_prompt_over_the_context_is_rejected_and_the_worker_keeps_serving(
    vllm_cluster, conductor
):
    too_long = prompt_tokens(8193, seed=500)
    job = PrefillJob(
        request_id="too-long", model=MODEL, token_ids=too_long, decode_instance="decode-A"
    )
    with pytest.raises(RemoteError, match="outside 1..8192"):
        await conductor.bus.request(
            Subjects(CLUSTER).prefill_job("prefill-A"), job, PrefillResult, 30
        )
    result = await conductor.prefill("prefill-A", prompt_tokens(20, seed=501))
    assert result.num_computed_tokens == 20


@pytest.mark.parametrize("problem", ["missing", "not-llama"])
def test_bad_checkpoint_stops_the_worker_at_start_with_a_clear_error(tmp_path, problem):
    import subprocess

    model = tmp_path / "model"
    if problem == "not-llama":
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10}')
    argv = [
        sys.executable,
        "-m",
        "crescent.prefill",
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--nats-url",
        "nats://127.0.0.1:1",
        "--connect-timeout-s",
        "1",
        "--log-format",
        "text",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    reason = "no such directory" if problem == "missing" else "is not Llama family"
    assert reason in done.stderr


async def test_blocks_saved_after_a_store_restart_reach_the_new_store(
    vllm_cluster, conductor, reference
):
    """store-A is killed and started again: a new shm file under the same segment name.
    prefill-A and decode-A had mapped the old one. What prefill-A saves next must land in the
    new store's memory, not the dead one's: prefill-B then pulls that prefix from A's store
    (store to store over tcp, reading A's segment) and answers as plain vLLM does. Runs last
    in the module: it restarts a store the other tests use."""
    store = vllm_cluster.processes["store-A"]
    store.signal(signal.SIGKILL)
    store.popen.wait(10)
    store.start()
    vllm_cluster.wait_serving(["store-A"], 60)
    prefix = prompt_tokens(768, seed=700)
    on_a, on_b = prefix + prompt_tokens(70, seed=701), prefix + prompt_tokens(90, seed=702)
    expected = reference_tokens(reference, [on_a, on_b], MAX_TOKENS)
    prefix_hashes = block_hashes(prefix, BLOCK_SIZE, MODEL)
    lookup = LookupBlocks(model=MODEL, hashes=prefix_hashes)

    deadline = time.monotonic() + 30
    while True:  # a save that raced the new segment's publication is not stored: again
        got_a, _ = await conductor.generate(on_a, MAX_TOKENS, prefill_id="prefill-A")
        assert got_a == expected[0]
        await asyncio.sleep(1)  # its commits follow the answer
        held = await conductor.bus.request(Subjects(CLUSTER).store_ctl("A"), lookup, LookupReply, 5)
        if len(held.tiers) == len(prefix_hashes):
            break
        assert time.monotonic() < deadline, "prefill-A never saved to the restarted store-A"
    got_b, prefill = await conductor.generate(
        on_b, MAX_TOKENS, prefill_id="prefill-B", pull=("A", prefix_hashes)
    )

    assert got_b == expected[1]
    [load] = events_of(vllm_cluster, "prefill-B", prefill.request_id, "load")
    assert load["num_loaded"] == len(prefix_hashes) and load["error"] is None
