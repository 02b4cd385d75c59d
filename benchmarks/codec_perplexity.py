"""What a KV codec costs in perplexity when the context's KV comes back through it, as from an offload tier.

The pydoc topics text is scored as `jido eval perplexity` scores it (chunks of ``--context-length`` tokens, the
second half of each scored), prefilled ``--step-tokens`` at a time; after each step every block of KV that is
now full is encoded with the codec and decoded back into the cache, in place. So each scored token attends
to earlier steps' KV as a tier would return it (~90% of its context at the defaults) and to its own step's
exactly. ``raw`` must give the plain engine's perplexity to the last digit: the check that the round trip
itself changes nothing. Per codec: perplexity, its ratio to the plain run, and the bytes per token stored.

    flock /tmp/jido-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/codec_perplexity.py
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from jido import LLM
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.core.outputs import SchedulerOutput
from jido.kvtransfer.block_io import BlockIO
from jido.kvtransfer.codecs import make_codec
from jido.tools.perplexity import PerplexityConfig, evaluate
from jido.utils.reference_text import reference_text

RESULTS = Path(__file__).parent / "results"


class CodecRoundTrip:
    """Wraps the in-process runner's ``execute_model``: after each step, the blocks that became full pass through
    the codec (encode, decode, written back), once each; counts the bytes the codec stored."""

    def __init__(self, llm: LLM, codec_name: str) -> None:
        engine = llm.llm_engine
        self.runner = engine.core.executor.worker.runner
        config = engine.core.kv_plan.kv_cache_config
        self.blocks = BlockIO(self.runner.kv_caches, config, self.runner.attn_backend.block_token_dim)
        self.codec = make_codec(codec_name, engine.model_arch.num_layers, self.blocks.dtype)
        self.block_size = config.block_size
        self.num_groups = len(config.groups)
        self.done: dict[str, int] = {}  # request -> blocks already round-tripped (the same count in every group)
        self.stored_bytes = 0
        self.stored_tokens = 0
        execute = self.runner.execute_model

        def step(sched: SchedulerOutput):
            output = execute(sched)
            with torch.inference_mode():  # the cache tensors were made in inference mode
                self._round_trip(sched)
            return output

        self.runner.execute_model = step

    def _round_trip(self, sched: SchedulerOutput) -> None:
        for req_id in sched.finished_req_ids:
            self.done.pop(req_id, None)
        for req_id, num_new in sched.num_scheduled_tokens.items():
            _, num_computed, tables = self.runner.input_batch.request_view(req_id)
            full = (num_computed + num_new) // self.block_size
            first = self.done.get(req_id, 0)
            for group, table in enumerate(tables):
                for position in range(first, min(full, len(table))):
                    if table[position] != 0:  # 0: a sliding window's released position, never read
                        self._through_codec(group, int(table[position]))
            self.stored_tokens += max(0, full - first) * self.block_size
            self.done[req_id] = max(first, full)

    def _through_codec(self, group: int, block_id: int) -> None:
        block = self.blocks.read(group, block_id)
        layers = self.blocks.layers(group)
        payload = self.codec.encode(block, layers)
        self.stored_bytes += len(payload)
        self.blocks.write(group, block_id, self.codec.decode(memoryview(payload), tuple(block.shape), block.dtype,
                                                             layers))


def score(codec: str | None, args: argparse.Namespace) -> dict:
    llm = LLM(args.model, kv_cache_memory="256MiB", max_num_seqs=1, max_num_batched_tokens=args.step_tokens)
    tap = CodecRoundTrip(llm, codec) if codec is not None else None
    result = evaluate(llm, reference_text(), PerplexityConfig(args.context_length, args.max_chunks))
    llm.shutdown()
    row = {"codec": codec or "none (plain engine)", "perplexity": result.perplexity, "stderr": result.stderr,
           "scored_tokens": result.num_scored_tokens, "wall_s": result.wall_s}
    if tap is not None and tap.stored_tokens:
        row["bytes_per_token"] = tap.stored_bytes / tap.stored_tokens
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", nargs="+", default=["raw", "int8", "cachegen"])
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--max-chunks", type=int, default=16)
    parser.add_argument("--step-tokens", type=int, default=64, help="max_num_batched_tokens: the prefill step")
    parser.add_argument("--model", default=None, help="default: jido's default model")
    parser.add_argument("--output", default=str(RESULTS / f"codec_perplexity-{now_iso()[:10]}-{cpu_kind()}.json"))
    args = parser.parse_args()
    rows = [score(None, args)]
    for codec in args.codecs:
        rows.append(score(codec, args))
        rows[-1]["ratio_to_plain"] = rows[-1]["perplexity"] / rows[0]["perplexity"]
        print(json.dumps(rows[-1]), flush=True)
    result = {"date": now_iso(), "machine": machine_info(), "args": vars(args), "rows": rows}
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
