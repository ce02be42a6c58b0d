"""Control-plane messages (DESIGN §4): what conductor, prefill, decode and store say on NATS.

Times are seconds (floats); `*_at` fields are wall-clock time.time() of the sender.
"""

from __future__ import annotations

import msgspec

from crescent.common.codec import Message


class ErrorReply(Message):
    """Any request may be answered with this instead of its result."""

    code: str
    message: str


class Ack(Message):
    request_id: str


class InstanceInfo(Message):
    """What an instance registers under instances/<role>/<id> in etcd (with its lease)."""

    role: str
    instance_id: str
    node: str
    model: str = ""
    http_url: str = ""
    max_model_len: int = 0
    kv_capacity_tokens: int = 0
    started_at: float = 0.0


class InstanceLoad(Message):
    """Telemetry every telemetry_period_s on telemetry.<role>.<id>."""

    role: str
    instance_id: str
    node: str
    sent_at: float
    period_s: float
    num_queued: int = 0
    num_running: int = 0
    queue_time_s: float = 0.0
    kv_used_tokens: int = 0
    kv_capacity_tokens: int = 0
    num_context_tokens: int = 0  # decode: context of the running batch (what a step's time depends on)
    recent_ttft_s: float = 0.0  # prefill: mean measured queue + compute time of recent jobs
    recent_tbt_s: float = 0.0  # decode: mean measured step time of recent steps
    bandwidth: dict[str, float] = {}  # store: measured bytes/s of recent pulls, by source node


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False


class PrefillJob(Message):
    """Conductor → prefill.<id>.job: compute the prompt's KV and the first token."""

    request_id: str
    model: str
    token_ids: list[int]
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    decode_instance: str = ""
    decode_node: str = ""
    block_size: int = 0  # tokens per KV block; 0: the job stores no KV
    pull_from_node: str = ""  # before computing, pull pull_hashes from this node's store into ours
    pull_hashes: list[bytes] = []


class PrefillCancel(Message):
    """Conductor → prefill.<id>.cancel: the client left or the job was placed elsewhere."""

    request_id: str


class PrefillResult(Message):
    request_id: str
    first_token: int
    num_computed_tokens: int
    num_cached_tokens: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0


class Reservation(Message):
    """Conductor → decode.<id>.reserve: hold KV room for a request about to be prefilled."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    ttl_s: float = 30.0


class ReservationReply(Message):
    request_id: str
    accepted: bool
    reason: str = ""


class DecodeStart(Message):
    """Conductor → decode.<id>.start: generate after the prompt and its first token."""

    request_id: str
    token_ids: list[int]
    first_token: int
    max_tokens: int
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)


class DecodeCancel(Message):
    request_id: str


class TokenChunk(Message):
    """Decode → tokens.<request_id>: new tokens in order; `seq` counts chunks from 0."""

    request_id: str
    seq: int
    token_ids: list[int]
    is_final: bool = False
    finish_reason: str | None = None
    error: str | None = None


class StoreStatsRequest(Message):
    pass


class StoreStats(Message):
    node: str
    instance_id: str
    num_blocks: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
