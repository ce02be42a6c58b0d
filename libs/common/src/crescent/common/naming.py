"""Names on the wire: NATS subjects (prefix crescent.<cluster>.) and etcd keys
(prefix /crescent/<cluster>/), per DESIGN §4. Nothing else spells them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from crescent.common.errors import ConfigError

TOKEN_PATTERN = r"^[A-Za-z0-9_-]+$"
_TOKEN = re.compile(TOKEN_PATTERN)


def check_token(kind: str, value: str) -> str:
    """Ids become subject tokens and key segments: no dots, wildcards, slashes or spaces."""
    if not _TOKEN.match(value):
        raise ConfigError(f"{kind} {value!r} must match [A-Za-z0-9_-]+")
    return value


@dataclass(frozen=True)
class Subjects:
    cluster: str

    @property
    def prefix(self) -> str:
        return f"crescent.{self.cluster}."

    def prefill_job(self, instance_id: str) -> str:
        return f"{self.prefix}prefill.{instance_id}.job"

    def prefill_cancel(self, instance_id: str) -> str:
        return f"{self.prefix}prefill.{instance_id}.cancel"

    def prefill_result(self, instance_id: str) -> str:
        return f"{self.prefix}prefill.{instance_id}.result"

    def decode_reserve(self, instance_id: str) -> str:
        return f"{self.prefix}decode.{instance_id}.reserve"

    def decode_start(self, instance_id: str) -> str:
        return f"{self.prefix}decode.{instance_id}.start"

    def decode_cancel(self, instance_id: str) -> str:
        return f"{self.prefix}decode.{instance_id}.cancel"

    def decode_resend(self, instance_id: str) -> str:
        return f"{self.prefix}decode.{instance_id}.resend"

    def tokens(self, request_id: str, owner: str = "") -> str:
        """The token stream of `request_id`; with an `owner` (the conductor reading it), one of
        the streams that conductor reads through a single subscription (`tokens_of`)."""
        return (
            f"{self.prefix}tokens.{owner}.{request_id}"
            if owner
            else f"{self.prefix}tokens.{request_id}"
        )

    def tokens_of(self, owner: str) -> str:
        return f"{self.prefix}tokens.{owner}.*"

    def start_reply(self, request_id: str, owner: str) -> str:
        """Where the decode answers a start that a prefill instance sent for `owner`, the
        conductor of `request_id` (PrefillJob.decode_start), which reads it (`start_replies_of`)."""
        return f"{self.prefix}started.{owner}.{request_id}"

    def start_replies_of(self, owner: str) -> str:
        return f"{self.prefix}started.{owner}.*"

    def store_ctl(self, node: str) -> str:
        return f"{self.prefix}store.{node}.ctl"

    def telemetry(self, role: str, instance_id: str) -> str:
        return f"{self.prefix}telemetry.{role}.{instance_id}"

    def telemetry_all(self) -> str:
        return f"{self.prefix}telemetry.>"


@dataclass(frozen=True)
class Keys:
    cluster: str

    @property
    def prefix(self) -> str:
        return f"/crescent/{self.cluster}/"

    def config(self) -> str:
        return f"{self.prefix}config"

    def instances(self) -> str:
        return f"{self.prefix}instances/"

    def instance(self, role: str, instance_id: str) -> str:
        return f"{self.prefix}instances/{role}/{instance_id}"

    def costs(self) -> str:
        return f"{self.prefix}costs/"

    def cost(self, role: str, instance_id: str) -> str:
        """The instance's CostProfile, under its lease, beside instances/<role>/<id>."""
        return f"{self.prefix}costs/{role}/{instance_id}"

    def segments(self, node: str) -> str:
        return f"{self.prefix}segments/{node}"

    def blocks(self, model: str) -> str:
        return f"{self.prefix}blocks/{model}/"

    def block(self, model: str, block_hash: bytes, node: str) -> str:
        return f"{self.prefix}blocks/{model}/{block_hash.hex()}/{node}"

    def autoscale(self, model: str) -> str:
        return f"{self.prefix}autoscale/{model}"
