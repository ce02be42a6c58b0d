"""Node-to-node KV transfers at the NIC's bandwidth. Each node sends one transfer at a time and
receives one at a time (full duplex), so pulls and replications that share a node queue behind
each other instead of all getting the full link."""

from __future__ import annotations


class Network:
    def __init__(self, bytes_per_s: float) -> None:
        if not bytes_per_s > 0:
            raise ValueError(f"bandwidth must be > 0, got {bytes_per_s}")
        self.bytes_per_s = bytes_per_s
        self._send_free: dict[str, float] = {}
        self._recv_free: dict[str, float] = {}
        self.num_bytes = 0.0

    def transfer(self, source: str, target: str, num_bytes: float, now: float) -> float:
        """When `num_bytes` from `source` have landed on `target`, if started no earlier than
        now."""
        if num_bytes <= 0 or source == target:
            return now
        start = max(now, self._send_free.get(source, 0.0), self._recv_free.get(target, 0.0))
        end = start + num_bytes / self.bytes_per_s
        self._send_free[source] = self._recv_free[target] = end
        self.num_bytes += num_bytes
        return end
