"""Turning a remote segment name into its descriptor.

The engine never talks to etcd: whoever builds it passes a resolver, a sync or async
callable `name -> SegmentDescriptor` (the store service's resolver reads etcd; tests use
`DictResolver`). A resolver signals an unknown name by raising KeyError or
SegmentNotFound, or by returning None.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

from crescent.transfer.batch import Deadline
from crescent.transfer.descriptor import SegmentDescriptor
from crescent.transfer.errors import ResolverFailed, SegmentNotFound, TransferError

Resolver = Callable[[str], "SegmentDescriptor | None | Awaitable[SegmentDescriptor | None]"]

log = logging.getLogger(__name__)


class DictResolver:
    """Descriptors held in a dict: for tests and single-process setups."""

    def __init__(self, descriptors: dict[str, SegmentDescriptor] | None = None) -> None:
        self._descriptors = dict(descriptors or {})

    def publish(self, descriptor: SegmentDescriptor) -> None:
        self._descriptors[descriptor.name] = descriptor

    def withdraw(self, name: str) -> None:
        self._descriptors.pop(name, None)

    def __call__(self, name: str) -> SegmentDescriptor | None:
        return self._descriptors.get(name)


async def resolve(resolver: Resolver, name: str, deadline: Deadline) -> SegmentDescriptor:
    """Ask the resolver, bounded by the batch deadline."""
    try:
        answer = resolver(name)
    except (KeyError, SegmentNotFound):
        raise SegmentNotFound(name) from None
    if inspect.isawaitable(answer):
        return await _await_answer(name, answer, deadline)
    return _checked(name, answer)


async def resolve_all(
    resolver: Resolver, names: Iterable[str], deadline: Deadline
) -> dict[str, SegmentDescriptor | TransferError]:
    """Resolve distinct names, each to its descriptor or to the error that says why not.
    A resolver that fails in an unexpected way (its store is down) fails its names with
    ResolverFailed instead of failing the whole batch.

    Answers of a sync resolver are used at once; only async answers are awaited, all
    together, so a batch resolved from a dict or a cache costs no task per name.
    """
    resolved: dict[str, SegmentDescriptor | TransferError] = {}
    pending: dict[str, Awaitable[SegmentDescriptor | None]] = {}
    for name in names:
        try:
            answer = resolver(name)
        except (KeyError, SegmentNotFound):
            resolved[name] = SegmentNotFound(name)
            continue
        except Exception as exc:
            resolved[name] = _failed(name, exc)
            continue
        if inspect.isawaitable(answer):
            pending[name] = answer
        else:
            resolved[name] = _checked_or_error(name, answer)
    if pending:
        results = await asyncio.gather(
            *(_await_answer(name, answer, deadline) for name, answer in pending.items()),
            return_exceptions=True,
        )
        for name, result in zip(pending, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException) and not isinstance(result, TransferError):
                result = _failed(name, result)
            resolved[name] = result
    return resolved


async def _await_answer(
    name: str, answer: Awaitable[SegmentDescriptor | None], deadline: Deadline
) -> SegmentDescriptor:
    try:
        async with asyncio.timeout(deadline.remaining()):
            result = await answer
    except (KeyError, SegmentNotFound):
        raise SegmentNotFound(name) from None
    except TimeoutError:
        raise deadline.timeout_error(name) from None
    return _checked(name, result)


def _failed(name: str, exc: BaseException) -> ResolverFailed:
    log.warning("resolver failed for segment %r", name, exc_info=exc)
    return ResolverFailed(name, repr(exc))


def _checked_or_error(name: str, answer: object) -> SegmentDescriptor | TransferError:
    try:
        return _checked(name, answer)
    except TransferError as exc:
        return exc


def _checked(name: str, answer: object) -> SegmentDescriptor:
    if answer is None:
        raise SegmentNotFound(name)
    if not isinstance(answer, SegmentDescriptor):
        raise TransferError(f"resolver returned {type(answer).__name__} for segment {name!r}")
    if answer.name != name:
        raise TransferError(f"resolver returned segment {answer.name!r} for {name!r}")
    return answer
