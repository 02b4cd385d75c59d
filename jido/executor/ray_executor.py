"""RayExecutor: one Ray actor per rank, placed on a Ray cluster by a placement group; the actors form the
torch.distributed group between them."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.executor.abstract import Executor, WorkerError, call_worker

logger = logging.getLogger("jido")
_CPUS_PER_WORKER_ENV = "JIDO_RAY_CPUS_PER_WORKER"  # debugging switch: CPUs each rank's bundle asks for
_PLACEMENT_TIMEOUT_S = 120.0
_HEALTH_TIMEOUT_S = 10.0


class RayWorkerActor:
    """The process of one rank on some node of the cluster: reports its address, then hosts a Worker."""

    def __init__(self) -> None:
        self.worker: Any = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port on it (rank 0's are the rendezvous address)."""
        from jido.executor.multiproc_executor import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def start(self, config: EngineConfig, model_folder: Path, rank: int, init_method: str, num_threads: int) -> str:
        from jido.runner.worker import Worker  # imported here: only worker actors load the model code

        self.worker = Worker(config, model_folder, rank, init_method, num_threads)
        return ray.get_runtime_context().get_node_id()

    def call(self, method: str | Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        return call_worker(self.worker, method, args, kwargs)

    def ping(self) -> bool:
        return True


class RayExecutor(Executor):
    """Places ``world_size`` workers with one placement group (a bundle of ``CPU`` per rank, packed onto as few
    nodes as fit) on the Ray cluster this process is connected to (``ray.init`` already called, or
    ``RAY_ADDRESS``, else a local one), then has them join one process group at rank 0's node.

    Every call goes to every actor; a dead actor or a raising worker fails the call with
    :class:`WorkerError`, the others are killed, and the executor stays failed.
    NOTE: the model folder must exist at the same path on every node (a shared volume, or the same cache).
    """

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        super().__init__(config, model_folder)
        self._failed: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jido-ray-executor")
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
        world_size = config.parallel_config.world_size
        cpus = float(os.environ.get(_CPUS_PER_WORKER_ENV, 1))
        self.placement_group = placement_group([{"CPU": cpus}] * world_size, strategy="PACK")
        self.actors: list[Any] = []
        try:
            self._place(world_size, cpus)
            self._start_workers(world_size, max(1, int(cpus)))
        except BaseException:
            self.shutdown()
            raise

    def _place(self, world_size: int, cpus: float) -> None:
        try:
            ray.get(self.placement_group.ready(), timeout=_PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            raise WorkerError(f"the Ray cluster could not place {world_size} workers of {cpus:g} CPU each within "
                              f"{_PLACEMENT_TIMEOUT_S:g} s; cluster resources: {ray.cluster_resources()}") from None
        actor_class = ray.remote(num_cpus=cpus)(RayWorkerActor)
        self.actors = [actor_class.options(name=None, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.placement_group, placement_group_bundle_index=rank)).remote() for rank in range(world_size)]

    def _start_workers(self, world_size: int, threads: int) -> None:
        ip, port = ray.get(self.actors[0].address.remote())
        init_method = f"tcp://{ip}:{port}"
        self.node_ids = self._get([actor.start.remote(self.config, self.model_folder, rank, init_method, threads)
                                   for rank, actor in enumerate(self.actors)])
        logger.info("Ray: %d workers joined at %s, on %d nodes", world_size, init_method, len(set(self.node_ids)))

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        self.check_failed()
        return self._get([actor.call.remote(method, args, kwargs or {}) for actor in self.actors])

    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        return self._execute_on_every_rank(scheduler_output, non_block, self._pool)

    def check_failed(self) -> None:
        if self._failed is not None:
            raise WorkerError(self._failed)

    def check_health(self) -> None:
        self.check_failed()
        self._get([actor.ping.remote() for actor in self.actors], timeout=_HEALTH_TIMEOUT_S)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None
        self._pool.shutdown(wait=False)

    def _get(self, refs: list[Any], timeout: float | None = None) -> list[Any]:
        """The results in rank order; the first failure (a dead actor is named first) fails the executor."""
        try:
            return ray.get(refs, timeout=timeout)
        except (RayActorError, RayTaskError, GetTimeoutError, RayError) as exc:
            reason = self._dead_actor() or f"a Ray worker failed: {exc}"
            self._failed = self._failed or reason
            logger.error("%s", self._failed)
            for actor in self.actors:
                ray.kill(actor)
            raise WorkerError(self._failed) from None

    def _dead_actor(self) -> str | None:
        for rank, actor in enumerate(self.actors):
            try:
                ray.get(actor.ping.remote(), timeout=_HEALTH_TIMEOUT_S)
            except (RayError, GetTimeoutError) as exc:
                return f"worker {rank} (Ray actor) is gone: {type(exc).__name__}"
        return None
