"""Control-plane messages (DESIGN §4): what conductor, prefill, decode and store say on NATS.

Times are seconds (floats); `*_at` fields are wall-clock time.time() of the sender. Field types
from `bounds` carry the ranges a decoded body must respect.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from crescent.common.bounds import (
    MAX_SEQUENCE_TOKENS,
    AssignmentNumber,
    Bandwidth,
    BlockHashes,
    Count,
    Id,
    Imbalance,
    LogitBias,
    Logprob,
    Logprobs,
    Name,
    NumBytes,
    NumLogprobs,
    OptionalId,
    Penalty,
    Period,
    Probability,
    RepetitionPenalty,
    SchemaText,
    Seconds,
    StopTokenIds,
    Temperature,
    Timestamp,
    TokenCount,
    TokenId,
    TokenIds,
    TopK,
    TopTokenIds,
    Ttl,
    Url,
)
from crescent.common.codec import Message


class ErrorReply(Message):
    """Any request may be answered with this instead of its result."""

    code: Name
    message: str


REPLY_TOO_LARGE = "reply_too_large"
"""ErrorReply.code of a reply the NATS server would refuse for its size (Bus._sendable): asking
another instance the same would get the same answer."""


class Ack(Message):
    request_id: Id


class InstanceInfo(Message):
    """What an instance registers under instances/<role>/<id> in etcd (with its lease)."""

    role: Id
    instance_id: Id
    node: Id
    model: Name = ""
    http_url: Url = ""
    max_model_len: TokenCount = 0
    kv_capacity_tokens: Count = 0
    started_at: Timestamp = 0.0
    engine: Name = ""  # prefill/decode: "vllm" or "emulated" (what the conductor may ask of it)


class InstanceLoad(Message):
    """Telemetry every telemetry_period_s on telemetry.<role>.<id>."""

    role: Id
    instance_id: Id
    node: Id
    sent_at: Timestamp
    period_s: Period
    num_queued: Count = 0
    num_running: Count = 0
    queue_time_s: Seconds = 0.0
    running_s: Seconds = (
        0.0  # prefill: how long the job computing now has run (queue_time_s counts it whole)
    )
    # prefill: that job's share of queue_time_s, so that its overrun is not taken off the rest
    running_predicted_s: Seconds = 0.0
    kv_used_tokens: Count = 0
    kv_capacity_tokens: Count = 0
    num_context_tokens: Count = (
        0  # decode: context of the running batch (what a step's time depends on)
    )
    # decode: the prompt tokens of the reservations not yet started (counted in num_queued),
    # which join the batch next
    num_queued_context_tokens: Count = 0
    recent_ttft_s: Seconds = 0.0  # prefill: mean measured queue + compute time of recent jobs
    recent_tbt_s: Seconds = 0.0  # decode: mean measured step time of recent steps
    bandwidth: dict[Id, Bandwidth] = {}  # store: measured bytes/s of recent pulls, by source node
    # False while the instance takes no new work: it is draining (shutting down), or "full"
    # (decode: no KV room left); `not_accepting_reason` says which.
    is_accepting: bool = True
    not_accepting_reason: Name = ""
    # prefill/decode: by conductor id, the highest assignment number (PrefillJob.assignment,
    # Reservation.assignment) received from that conductor. Everything up to it is counted in
    # this message; a conductor keeps adding what it sent after it (conductor/cluster_view.py).
    received: dict[Id, AssignmentNumber] = {}


class DesiredInstances(Message):
    """What a conductor's P/D ratio controller (paper §5.1) wants a model to run, written under
    autoscale/<model> in etcd (with the conductor's lease) for `crescent up --autoscale`; the
    same counts are its crescent_desired_instances gauges, for a Kubernetes autoscaler."""

    model: Name
    prefill: Count
    decode: Count
    decided_at: Timestamp
    conductor: Id
    imbalance: Imbalance | None = None  # f_im of the window that decided
    reason: str = ""  # the controller's latest proposal and why


class StructuredOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The grammar a request's output must follow: a JSON schema (as JSON text), or any JSON
    object."""

    json_schema: SchemaText = ""
    json_object: bool = False


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick each output token; the defaults change nothing (greedy, no penalties)."""

    temperature: Temperature = 0.0
    top_p: Probability = 1.0
    top_k: TopK = 0  # 0 or -1: every token
    min_p: Probability = 0.0
    seed: int | None = None  # any msgpack integer (int64 or uint64), as the engines take
    stop_token_ids: StopTokenIds = []
    ignore_eos: bool = False
    min_tokens: TokenCount = 0  # tokens generated before EOS or a stop token may end the output
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    logit_bias: LogitBias = {}
    logprobs: NumLogprobs | None = (
        None  # per output token: its log-probability and this many alternatives
    )
    prompt_logprobs: NumLogprobs | None = None  # the same for every prompt token but the first
    structured: StructuredOutput | None = None

    @property
    def depends_on_output(self) -> bool:
        """Whether a token's odds depend on the tokens generated before it in a way the engine
        counts only for its own output (presence/frequency penalties, a grammar's state): such
        a request cannot continue from earlier output placed in its prompt."""
        return bool(self.presence_penalty or self.frequency_penalty or self.structured is not None)


class TokenLogprobs(msgspec.Struct, array_like=True):
    """One token's log-probability and the most likely alternatives at its position, best
    first (the engine's raw distribution, before penalties and temperature); -inf is MIN_LOGPROB."""

    logprob: Logprob
    top_ids: TopTokenIds = []
    top_logprobs: Logprobs = []


TokenLogprobsList = Annotated[list[TokenLogprobs], Meta(max_length=MAX_SEQUENCE_TOKENS)]


class PrefillJob(Message):
    """Conductor → prefill.<id>.job: compute the prompt's KV and the first token."""

    request_id: Id
    model: Name
    token_ids: TokenIds
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    decode_instance: OptionalId = ""
    decode_node: OptionalId = ""
    # Tokens per KV block the conductor hashed the prompt with; a prefill storing another size
    # refuses the job (0: not checked).
    block_size: TokenCount = 0
    source_node: OptionalId = ""  # first copy pull_hashes from this node's store into ours
    pull_hashes: BlockHashes = []
    # The prompt's prefix the conductor planned this node's store to supply, pulled blocks
    # included: the engine asks the store only when its own cache holds less than that, so a
    # request the store cannot help skips the lookup's round trip. A block committed after the
    # conductor's index last heard is not counted on, as in the placement. None: always ask.
    planned_prefix_tokens: TokenCount | None = None
    timeout_s: Seconds = 0.0  # how long the conductor waits for the result; 0: no deadline
    # The sending conductor and its number for this assignment, which the instance's telemetry
    # acknowledges (InstanceLoad.received); 0: not numbered.
    conductor: OptionalId = ""
    assignment: AssignmentNumber = 0
    # The start the prefill instance sends decode_instance once its first token is out, that
    # token and the prompt (token_ids, sent once, in the job) filled in
    # (DecodeStart.from_prefill); the decode answers on
    # started.<stream_owner>.<request_id>. None: the conductor starts the decode itself.
    decode_start: DecodeStart | None = None
    # A first token among these ends the answer (a stop token, or the end of sequence): then no
    # decode_start is sent, as no decode follows.
    ends_on_first: TokenIds = []


class PrefillResultAsk(Message):
    """Conductor → prefill.<id>.result after its NATS connection dropped while it waited for a
    job: the job's PrefillResult (or the error it ended with) once it is done, waiting up to
    `wait_s` for a job still queued or computing; the job's reply may have been lost."""

    request_id: Id  # the job's id (PrefillJob.request_id)
    wait_s: Seconds
    # The result's prompt logprobs from this index on: the rest of a result whose logprobs
    # did not fit one message (PrefillResult.num_prompt_logprobs_left).
    prompt_logprobs_from: Count = 0


class PrefillCancel(Message):
    """Conductor → prefill.<id>.cancel: the client left or the job was placed elsewhere."""

    request_id: Id
    conductor: OptionalId = ""  # numbered like an assignment: InstanceLoad.received says when
    assignment: AssignmentNumber = 0  # the job no longer counts in the instance's load


class PrefillResult(Message):
    request_id: Id
    first_token: TokenId
    num_computed_tokens: TokenCount
    num_cached_tokens: TokenCount = 0
    queue_s: Seconds = 0.0  # from arrival to its compute turn: the planned pull is inside it
    compute_s: Seconds = 0.0
    transfer_s: Seconds = 0.0  # the planned prefix pull (0: none planned)
    first_logprobs: TokenLogprobs | None = None  # when the job's sampling asks for logprobs
    # when it asks for prompt_logprobs: prompt tokens 1..n-1, or as many of them as fit one
    # message (crescent.common.payload), from PrefillResultAsk.prompt_logprobs_from on
    prompt_logprobs: TokenLogprobsList = []
    num_prompt_logprobs_left: TokenCount = 0  # those after the ones carried: ask for them


class Reservation(Message):
    """Conductor → decode.<id>.reserve: hold KV room for a request about to be prefilled."""

    request_id: Id
    num_prompt_tokens: TokenCount
    max_tokens: TokenCount
    ttl_s: Ttl = 30.0
    conductor: OptionalId = ""  # as in PrefillJob: acknowledged by InstanceLoad.received
    assignment: AssignmentNumber = 0
    # The request was admitted and ran elsewhere until its decode instance failed: held on KV
    # room alone, not refused for the predicted TBT, which would fail an answer under way.
    is_moved: bool = False


class ReservationReply(Message):
    request_id: Id
    accepted: bool
    reason: str = ""


class DecodeStart(Message):
    """Conductor (or prefill, `from_prefill`) → decode.<id>.start: generate after the prompt
    and its first token. Without a first token (conditional disaggregation) the decode instance
    computes the prompt itself and the first token it streams is the first output token."""

    request_id: Id
    token_ids: TokenIds
    first_token: TokenId | None
    max_tokens: TokenCount
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    # The conductor that reads the tokens, on tokens.<owner>.<request_id>; "" for
    # tokens.<request_id>.
    stream_owner: OptionalId = ""
    # No reservation came first (the decode computes the prompt, so nothing is prefilled
    # meanwhile): the start is admitted as a reservation would be, or refused with the reason
    # (an error reply coded StartRefused). Numbered like a Reservation.
    admit: bool = False
    conductor: OptionalId = ""
    assignment: AssignmentNumber = 0
    # Sent by the prefill instance as its first token is out (PrefillJob.decode_start), one hop
    # sooner than through the conductor. It may overtake its reservation: with none held, it is
    # admitted as `admit` is, or refused (StartRefused).
    from_prefill: bool = False


class DecodeCancel(Message):
    request_id: Id
    conductor: OptionalId = ""  # as in PrefillCancel
    assignment: AssignmentNumber = 0


class TokenChunk(Message):
    """Decode → tokens.<request_id>: new tokens in order; `seq` counts chunks from 0."""

    request_id: Id
    seq: Count
    token_ids: TokenIds
    # decode's monotonic clock at the step that made the chunk's last token: the conductor's
    # TBT sample compares it only with the same stream's chunks, so read delays do not count
    step_at: Seconds
    logprobs: TokenLogprobsList = []  # one per token id, when the request asks for logprobs
    is_final: bool = False
    finish_reason: Name | None = None
    error: str | None = None
    # The kind of error, as ErrorReply.code: InvalidRequestError when the engine refused the
    # request's parameters, which no other instance would take either.
    error_code: Name | None = None
    # On the first chunk of a prompt the decode instance computed itself (conditional
    # disaggregation): its tokens that were loaded from the store, not computed.
    num_cached_tokens: TokenCount | None = None


# A stream has at most one chunk per token, and one final chunk that may carry none.
TokenChunks = Annotated[list[TokenChunk], Meta(max_length=MAX_SEQUENCE_TOKENS + 1)]


class ResendTokens(Message):
    """Conductor → decode.<id>.resend after its NATS connection dropped mid-stream: the chunks
    of `request_id` from `from_seq` on, which the drop may have lost on the way."""

    request_id: Id
    from_seq: Count


class ResentTokens(Message):
    """The chunks asked for, in order (none when none were sent since), as many as fit one
    message, and how many more follow them (ask again from the next seq); `is_known` False:
    the instance has no stream under that id (never started here, cancelled, or long
    finished)."""

    request_id: Id
    is_known: bool
    chunks: TokenChunks = []
    num_chunks_left: Count = 0


class ClusterConfig(Message):
    """Value of the `config` key in etcd: what every service of the cluster must agree on.
    Written once by the first conductor (cluster_config)."""

    block_size: TokenCount  # tokens per KV block: the unit of block hashes and of the stores
    ttft_slo_s: Seconds
    tbt_slo_s: Seconds
    model: Name = ""  # the model served; "": any (workers are not checked)


class StoreStatsRequest(Message):
    pass


class StoreStats(Message):
    node: Id
    instance_id: Id
    num_blocks: Count = 0
    used_bytes: NumBytes = 0
    capacity_bytes: NumBytes = 0
