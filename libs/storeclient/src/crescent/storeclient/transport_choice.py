"""An explicit choice of data-plane transports, as the store daemon and the vLLM connector take
it from their settings (`--transports tcp`, `--kv-transports shm,tcp`).

A named transport that cannot run on this machine is a start-up error: the process says why and
exits, rather than moving bytes over another transport than the one its operator asked for.
"""

from __future__ import annotations

from crescent.common.errors import ConfigError
from crescent.transfer import TransportKind, TransportUnavailable, parse_transports
from crescent.transfer.transports import check_transports


def transport_choice(
    flag: str, text: str, rdma_device: str | None = None
) -> tuple[TransportKind, ...] | None:
    """`text` as transports (None: every transport that runs here); ConfigError naming `flag`
    for an unknown name or one that cannot run on this machine."""
    try:
        kinds = parse_transports(text)
        check_transports(kinds, rdma_device)
    except (ValueError, TransportUnavailable) as exc:
        raise ConfigError(f"--{flag.replace('_', '-')} {text}: {exc}") from exc
    return kinds
