"""The KV connector seam, scheduler side: what the core asks of anything that keeps or moves KV outside the pool.

Split like vLLM v1's ``KVConnectorBase_V1``. The scheduler side (this interface, implemented in
``jido/kvtransfer``) decides: which tokens of a waiting request can be loaded from outside the device pool,
what to save, and what the workers must do this step, carried to them as opaque per-step metadata in
:class:`jido.core.outputs.SchedulerOutput`. The worker side (``jido.kvtransfer.base.KVConnectorWorker``)
moves the bytes and reports back in :class:`KVConnectorOutput`, carried in ``ModelRunnerOutput``.

A load is asynchronous: the request waits in ``WAITING_FOR_REMOTE_KVS`` holding the blocks it loads into,
without taking part in any step, until the workers report the load finished (or failed: then the request
computes those tokens itself). The core imports no torch, transport or store: only this interface.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jido.core.block_pool import BlockKey  # (group, block hash): what names one pool block's contents
from jido.core.request import Request


@dataclass(frozen=True)
class ReleasedBlock:
    """A cached block no request holds any more: the pool may overwrite it from the next allocation on.

    Its contents stay intact until the next step's forward, so a connector that saves them in that step
    (before the forward) has them whether or not the pool evicts the block meanwhile.
    """

    block_id: int
    key: BlockKey
    token_ids: tuple[int, ...]


@dataclass
class KVConnectorOutput:
    """What the workers report after a step: finished transfers, failures and counters.

    ``finished_loading`` maps each request whose load ended to whether every block arrived intact; a
    request with a failed block computes the tokens itself. ``finished_saving`` names finished requests
    whose blocks the workers no longer read (sent, released by the peer, or their lease ran out): the
    scheduler frees the blocks it held for them. ``events`` are connector-specific records (stored sizes,
    write failures, tiers disabled, transfers) that the scheduler side reads back.
    """

    finished_loading: dict[str, bool] = field(default_factory=dict)
    finished_saving: set[str] = field(default_factory=set)
    events: list[Any] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.finished_loading or self.finished_saving or self.events)


class KVConnectorScheduler(ABC):
    """The scheduler's view of an external KV source and sink (offload tiers, another instance).

    Call order in one scheduling pass: for a waiting request, :meth:`get_num_new_matched_tokens` after the
    device prefix-cache lookup; if it offers tokens and the blocks were allocated,
    :meth:`update_state_after_alloc`; cached blocks arrive through :meth:`on_blocks_released` whenever their
    last holder lets go (before the pool can evict them); at the end of the pass :meth:`build_connector_meta` makes the step's
    metadata (and forgets what it handed over). After the step, :meth:`update_connector_output` takes the
    workers' report. :meth:`request_finished` is called once when a request ends for any reason; it may
    keep the request's blocks (a producer holding KV for a consumer) until the workers name the request
    in ``finished_saving``.

    Invariants:
        - Every block id named in the metadata is held by a request or was released in this same pass;
          blocks a load writes into stay held by the waiting request until its load is reported finished.
        - Nothing here may block on a slow store for longer than the store's own timeout: a store that is
          down or slow is a miss.
    """

    @abstractmethod
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens past ``num_computed_tokens`` (the device hit, a multiple of the block size) loadable from outside.

        Returns a count that leaves at least one prompt token to compute: a multiple of the block size for
        cached blocks, or every prompt token but the last for KV handed over by another instance (the last
        block is then partly loaded); 0 when nothing can be loaded. Loads are always asynchronous.
        """

    @abstractmethod
    def update_state_after_alloc(self, request: Request, block_ids: list[list[int]], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        """The request now holds ``block_ids`` (per group, every position so far): schedule the load of
        positions ``num_computed_tokens // block_size`` up to ``+ num_external_tokens // block_size``."""

    @abstractmethod
    def on_blocks_released(self, blocks: list[ReleasedBlock]) -> None:
        """Cached blocks the pool may now evict; a connector that keeps KV below the pool saves them this step.

        Saving on release rather than on eviction keeps the tiers a superset of the pool's free cached
        blocks, so a lookup never finds a prefix split between the pool and a tier.
        """

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any, block_ids: Callable[[str], list[list[int]]]) -> Any:
        """The workers' instructions for this step (picklable); called once per scheduling pass.

        ``scheduler_output`` is the step being built (a ``SchedulerOutput``: its ``num_scheduled_tokens`` say which requests
        compute which tokens, counted from each request's ``num_computed_tokens``); ``block_ids(req_id)``
        gives a scheduled request's block ids per group, every position so far.
        """

    @abstractmethod
    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Take the workers' report of a step (sizes stored, failures, tiers gone)."""

    def request_finished(self, request: Request, block_ids: list[list[int]]) -> tuple[bool, Any]:
        """A request ended (finished, aborted), holding ``block_ids``; returns ``(hold, params)``.

        With ``hold`` the scheduler keeps the blocks until a report names the request in
        ``finished_saving`` (the connector must make sure one comes: a lease); otherwise it frees them now.
        ``params`` (None, or a JSON-ready dict) goes out with the request's last output as
        ``kv_transfer_params``: a handle a consumer can load the KV with.
        """
        return False, None

    def has_pending_work(self) -> bool:
        """Whether the workers have instructions waiting for the next step (saves of blocks released since the
        last one). The engine steps once more for them even with no request left: the blocks a request releases
        as it finishes reach the tiers then, not whenever the next request happens to come."""
        return False

    def stats(self) -> tuple:
        """Cumulative records for metrics (``jido.metrics.stats`` types); empty when there are none."""
        return ()
