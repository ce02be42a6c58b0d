"""The ranges control-plane message fields must lie in to decode (msgspec constraints).

A body of the right types that carries a negative count, a NaN or infinite float, an absurd
size or an id that would break a NATS subject is as malformed as one of the wrong types:
`codec.decode` raises MessageError, the bus answers with an error reply, and no handler ever
sees it (a NaN TTL, for one, would hold a decode instance's KV room for good). The bounds are
protocol-wide sanity limits, far beyond what any instance accepts: each service still checks a
request against its own limits (max_model_len, KV room). Constraints apply on decode only;
building a message in code does not check them.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from crescent.common.naming import TOKEN_PATTERN

MAX_SEQUENCE_TOKENS = 1 << 24  # prompt + output of one request: beyond any model's context
MAX_TOKEN_ID = (1 << 32) - 1  # block hashing packs token ids as uint32
MAX_COUNT = 1 << 40  # requests, tokens held by an instance, blocks, slots
MAX_ASSIGNMENT = (1 << 63) - 1  # a conductor's assignment numbers start at its start time in µs
MAX_BYTES = 1 << 50  # a segment, an offset into one, a block (1 PiB)
MAX_SECONDS = 7 * 24 * 3600.0  # a measured or predicted duration
MAX_TTL_S = 3600.0  # how long a reservation, allocation or pin may hold resources unattended
MAX_TIMESTAMP = 1e11  # wall-clock seconds since 1970 (the year 5138)
MAX_BANDWIDTH = 1e13  # bytes/s (80 Tbit/s)
MAX_IMBALANCE = 1e6  # f_im = (L̄_decode + 1) / (L̄_prefill + 1): loads are SLO ratios
MAX_TEMPERATURE = 100.0
MAX_STOP_TOKENS = 1024
MAX_PENALTY = 100.0  # presence, frequency (OpenAI: -2..2) and repetition penalties
MAX_LOGIT_BIAS = 100.0  # OpenAI's range of one token's bias
MAX_BIASED_TOKENS = 1 << 20  # tokens one logit_bias names (a vocabulary)
MAX_TOP_LOGPROBS = 1024  # alternatives returned per token (the conductor allows 20)
MIN_LOGPROB = -9999.0  # what a -inf log-probability is carried as (OpenAI's convention)
MAX_SCHEMA_CHARS = 1 << 20  # a structured-output JSON schema, as JSON text
MAX_HASH_BYTES = 64  # a block hash (the store checks the exact size)
MAX_NAME_LENGTH = 253  # ids, nodes and models: a DNS name's length
MAX_URL_LENGTH = 2048

TokenCount = Annotated[int, Meta(ge=0, le=MAX_SEQUENCE_TOKENS)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_SEQUENCE_TOKENS)]
StopTokenIds = Annotated[list[TokenId], Meta(max_length=MAX_STOP_TOKENS)]
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
AssignmentNumber = Annotated[int, Meta(ge=0, le=MAX_ASSIGNMENT)]
NumBytes = Annotated[int, Meta(ge=0, le=MAX_BYTES)]
Offsets = Annotated[list[NumBytes], Meta(max_length=MAX_SEQUENCE_TOKENS)]  # one per block
Seconds = Annotated[float, Meta(ge=0.0, le=MAX_SECONDS)]
Period = Annotated[float, Meta(gt=0.0, le=MAX_SECONDS)]
Ttl = Annotated[float, Meta(gt=0.0, le=MAX_TTL_S)]
Timestamp = Annotated[float, Meta(ge=0.0, le=MAX_TIMESTAMP)]
Bandwidth = Annotated[float, Meta(ge=0.0, le=MAX_BANDWIDTH)]
Imbalance = Annotated[float, Meta(gt=0.0, le=MAX_IMBALANCE)]
Temperature = Annotated[float, Meta(ge=0.0, le=MAX_TEMPERATURE)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-MAX_PENALTY, le=MAX_PENALTY)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=MAX_PENALTY)]
TopK = Annotated[int, Meta(ge=-1, le=MAX_TOKEN_ID)]  # 0 or -1: every token
LogitBias = Annotated[
    dict[TokenId, Annotated[float, Meta(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]],
    Meta(max_length=MAX_BIASED_TOKENS),
]
NumLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
Logprob = Annotated[float, Meta(ge=MIN_LOGPROB, le=0.0)]
Logprobs = Annotated[list[Logprob], Meta(max_length=MAX_TOP_LOGPROBS + 1)]
TopTokenIds = Annotated[list[TokenId], Meta(max_length=MAX_TOP_LOGPROBS + 1)]
SchemaText = Annotated[str, Meta(max_length=MAX_SCHEMA_CHARS)]
BlockHash = Annotated[bytes, Meta(max_length=MAX_HASH_BYTES)]
BlockHashes = Annotated[list[BlockHash], Meta(max_length=MAX_SEQUENCE_TOKENS)]  # ≥ 1 token each
# Ids (requests, instances, nodes) become NATS subject tokens and etcd key segments, as
# naming.check_token requires of the ids a service is configured with.
Id = Annotated[str, Meta(max_length=MAX_NAME_LENGTH, pattern=TOKEN_PATTERN)]
# An Id, or "" for none.
OptionalId = Annotated[str, Meta(max_length=MAX_NAME_LENGTH, pattern=f"^$|{TOKEN_PATTERN}")]
Name = Annotated[str, Meta(max_length=MAX_NAME_LENGTH)]  # models, tiers, codes, finish reasons
Url = Annotated[str, Meta(max_length=MAX_URL_LENGTH)]
BlockTiers = Annotated[list[Name], Meta(max_length=MAX_SEQUENCE_TOKENS)]  # one per block
