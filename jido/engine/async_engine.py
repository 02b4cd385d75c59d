"""AsyncEngine: runs an LLMEngine's step loop in its own thread and streams its outputs to asyncio tasks."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine, PromptType
from jido.engine.outputs import RequestOutput
from jido.metrics.stats import IterationStats, SchedulerStats

logger = logging.getLogger("jido")


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full and no running slot is free; the caller should retry later."""


class EngineStoppedError(RuntimeError):
    """The engine is draining or has stopped (or its loop died) and takes no new requests."""


@dataclass(frozen=True)
class StepReport:
    """The engine after one loop iteration, for metrics; ``times`` is None when no step ran."""

    times: IterationStats | None
    stats: SchedulerStats
    num_added: int  # sequences the engine has taken in since it started

    @property
    def queue_times_s(self) -> tuple[float, ...]:
        """Arrival -> first scheduled, for the requests first scheduled in this step."""
        return () if self.times is None else self.times.queue_times_s


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    pin: bool = False  # prefill the prompt and pin its KV blocks (LLMEngine.add_pin_request)
    kv_transfer_params: dict | None = None


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Unpin:
    pin_id: str


_STOP = object()


class RequestStream:
    """One request's outputs as an async iterator of cumulative RequestOutputs.

    The engine sends deltas; the stream merges them into one cumulative output (on the event loop, the
    only thread that reads it), so a consumer that falls behind gets the latest state (bigger deltas,
    nothing lost). NOTE: every iteration yields the same object, grown since the last one. Leaving the
    ``with`` block before the last output aborts the request in the engine.
    """

    def __init__(self, request_id: str, engine: AsyncEngine, num_seqs: int = 1) -> None:
        self.request_id = request_id
        self.num_seqs = num_seqs  # the request's n
        self.finished = False
        self._engine = engine
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Merge the engine's next delta, or record an error (final: later deltas are dropped)."""
        if isinstance(item, BaseException):
            self._error = self._error or item
        elif self._output is None:
            self._output = item
        else:
            self._output.add(item)
        self._ready.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        await self._ready.wait()
        self._ready.clear()
        if self._error is not None:
            self.finished = True
            raise self._error
        self.finished = self._output.finished
        return self._output

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the request: aborted in the engine unless it finished (what leaving ``with`` does)."""
        self._engine.release(self.request_id, abort=not self.finished)


class AsyncEngine:
    """Owns an LLMEngine on a background thread; asyncio code adds requests and reads RequestStreams.

    NOTE: after ``start()`` only the engine thread touches the LLMEngine's request state. Other threads
    (the event loop, the server's tokenizing workers) may call the tokenizer and the engine's read-only
    validator ``prepare_prompt``. Torch releases the GIL inside its ops, so the event loop keeps serving
    HTTP while a step computes.
    """

    def __init__(self, engine: LLMEngine, max_waiting_requests: int,
                 on_report: Callable[[StepReport], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        if not isinstance(max_waiting_requests, int) or max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be a positive integer, got {max_waiting_requests!r}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.max_num_seqs = engine.config.scheduler_config.max_num_seqs
        self._on_report = on_report
        self._on_failure = on_failure  # called on the event loop once the engine loop died
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._num_submitted = 0  # sequences, counted on the event loop
        self._num_added = 0  # sequences, counted on the engine thread
        self.last_report = StepReport(None, engine.get_scheduler_stats(), 0)
        self.accepting = True
        self.error: BaseException | None = None

    # -- event loop side --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read the streams."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="jido-engine", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Sequences accepted but not yet running: queued for the engine thread or in its waiting queue."""
        return self._num_submitted - self.last_report.num_added + self.last_report.stats.num_waiting

    @property
    def max_num_unfinished(self) -> int:
        """The most sequences ever accepted at once: every running slot taken and the waiting queue full."""
        return self.max_num_seqs + self.max_waiting_requests

    @property
    def num_free_slots(self) -> int:
        """Running slots free as of the last report; the sequences in ``num_waiting`` will take them first."""
        return max(0, self.max_num_seqs - self.last_report.stats.num_running)

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0, pin: bool = False,
                    kv_transfer_params: dict | None = None) -> RequestStream:
        """Queue a request and return its stream.

        Raises EngineStoppedError while draining or after a failure, and EngineOverloadedError when
        the sequences not yet running would exceed ``max_waiting_requests`` plus the free running
        slots. Invalid input surfaces as a ValueError raised by the stream. With ``pin`` the request
        prefills its prompt and pins its KV blocks under ``request_id`` (``LLMEngine.add_pin_request``).
        """
        if not self.accepting or self.error is not None:
            raise EngineStoppedError("the engine is shutting down" if self.error is None
                                     else f"the engine loop failed: {self.error}")
        self.check_room(params.n)
        stream = RequestStream(request_id, self, params.n)
        self._streams[request_id] = stream
        self._num_submitted += params.n
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self._inbox.put(_Add(request_id, prompt, params, arrival, priority, pin, kv_transfer_params))
        return stream

    def check_room(self, num_seqs: int) -> None:
        """Raise EngineOverloadedError unless ``num_seqs`` more sequences may be accepted now."""
        # Sequences that arrived but were not yet picked up count as waiting, yet the next step will
        # run them if slots are free: refusing them then would turn away a burst on an idle engine.
        waiting, free = self.num_waiting, self.num_free_slots
        if waiting + num_seqs > self.max_waiting_requests + free:
            raise EngineOverloadedError(f"this request needs {num_seqs} sequences; {waiting} are already waiting and "
                                        f"{free} of {self.max_num_seqs} running slots are free (the waiting limit "
                                        f"is {self.max_waiting_requests}); retry later")

    def unpin(self, pin_id: str) -> None:
        """Release a pinned prefix's blocks on the engine thread (an unknown id is ignored there)."""
        self._inbox.put(_Unpin(pin_id))

    def release(self, request_id: str, abort: bool) -> None:
        """Forget a stream; with ``abort`` also stop the request and free its KV blocks."""
        self._streams.pop(request_id, None)
        if abort:
            self._inbox.put(_Abort(request_id))

    def end_streams(self, message: str) -> None:
        """Refuse new requests; end every open stream with EngineStoppedError(message) and abort its request.

        For a drain that ran out of time: the handlers then answer a clean 503 (an error event and
        ``[DONE]`` when streaming) instead of being cancelled mid-response.
        """
        self.accepting = False
        for request_id, stream in list(self._streams.items()):
            stream.put(EngineStoppedError(message))
            self.release(request_id, abort=True)

    async def shutdown(self) -> None:
        """Abort what is left and stop the engine thread."""
        self.accepting = False
        for request_id in list(self._streams):
            self.release(request_id, abort=True)
        self._inbox.put(_STOP)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _publish(self, outputs: list[RequestOutput], report: StepReport) -> None:
        self.last_report = report
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)
        if self._on_report is not None:
            self._on_report(report)

    def _fail(self, request_id: str, error: BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put(error)

    def check_health(self) -> None:
        """Raise EngineStoppedError if the loop died or a worker is gone (a dead idle worker shows here first)."""
        if self.error is not None:
            raise EngineStoppedError(f"the engine loop failed: {self.error}")
        try:
            self.engine.check_health()
        except RuntimeError as exc:
            raise EngineStoppedError(f"the engine is unhealthy: {exc}") from None

    def _fail_all(self, error: BaseException) -> None:
        self.error = error
        for stream in self._streams.values():
            stream.put(EngineStoppedError(f"the engine loop failed: {error}"))
        if self._on_failure is not None:
            self._on_failure(error)

    # -- engine thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            # Held and loading KV keep the loop stepping: their ends arrive in the steps' reports.
            while self._take_commands(self._idle_wait_s()):
                if self._idle_wait_s() == 0:
                    self._step()
                else:
                    self._report([], None)  # idle, or a batch filling: publish the state the commands left
        except Exception as exc:  # noqa: BLE001 - every request must hear that the loop died
            logger.exception("engine loop failed")
            self._call(self._fail_all, exc)

    def _idle_wait_s(self) -> float | None:
        """How long to wait for a command before the next step: forever when idle, for the batch to fill while
        the scheduler's batching mode holds waiting requests back, else not at all."""
        if not self.engine.has_engine_work():
            return None
        return self.engine.get_scheduler_stats().admission_wait_s

    def _take_commands(self, wait_s: float | None) -> bool:
        """Apply queued adds and aborts, waiting up to ``wait_s`` (None: forever) for the first; False once told
        to stop."""
        try:
            command = self._inbox.get(block=wait_s != 0, timeout=wait_s)
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            self._apply(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: _Add | _Abort | _Unpin) -> None:
        if isinstance(command, _Abort):
            self.engine.abort_request([command.request_id])
            return
        if isinstance(command, _Unpin):
            try:
                self.engine.unpin(command.pin_id)
            except KeyError:
                pass  # deleted twice: the first one freed it
            return
        self._num_added += command.params.n
        try:
            if command.pin:
                self.engine.add_pin_request(command.request_id, command.prompt, command.arrival_time)
            else:
                self.engine.add_request(command.request_id, command.prompt, command.params, command.arrival_time,
                                        command.priority, command.kv_transfer_params)
        except ValueError as exc:
            self._call(self._fail, command.request_id, exc)

    def _step(self) -> None:
        outputs = self.engine.step()
        self._report(outputs, self.engine.last_iteration_stats)

    def _report(self, outputs: list[RequestOutput], times: IterationStats | None) -> None:
        report = StepReport(times, self.engine.get_scheduler_stats(), self._num_added)
        self._call(self._publish, outputs, report)

    def _call(self, fn: Callable, *args: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the event loop already closed: nobody is listening any more

