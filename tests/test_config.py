"""Engine configuration by concern: keywords routed to their config, each validated at the edge, flags generated."""
from __future__ import annotations

import pytest

from jido.cli import build_parser
from jido.config import EngineConfig, SpeculativeConfig, engine_keywords


def test_flat_keywords_land_in_the_config_that_owns_them():
    config = EngineConfig.from_kwargs(model="m.gguf", dtype="bfloat16", block_size=32, max_num_seqs=4,
                                      device="cpu", distributed_executor_backend="mp")
    assert config.model_config.model == "m.gguf" and config.model_config.dtype == "bfloat16"
    assert config.cache_config.block_size == 32 and config.scheduler_config.max_num_seqs == 4
    assert config.device_config.device == "cpu" and config.parallel_config.distributed_executor_backend == "mp"
    assert config.speculative_config is None and config.kv_transfer_config is None


def test_an_unknown_keyword_names_the_accepted_ones():
    with pytest.raises(TypeError, match=r"unknown engine setting\(s\) \['blocksize'\]; accepted: .*'block_size'"):
        EngineConfig.from_kwargs(blocksize=32)


@pytest.mark.parametrize("kwargs,message", [
    ({"dtype": "fp8"}, "dtype must be one of auto, float32, bfloat16, float16, got 'fp8'"),
    ({"block_size": 0}, "block_size must be a positive integer, got 0"),
    ({"kv_cache_memory": "2 parsecs"}, "cannot read size '2 parsecs'"),
    ({"max_num_batched_tokens": True}, "max_num_batched_tokens must be a positive integer, got True"),
    ({"distributed_executor_backend": "slurm"}, "distributed_executor_backend must be one of uni, mp, ray, got 'slurm'"),
    ({"scheduling_mode": "eager"}, "scheduling_mode must be one of continuous, dynamic, static, got 'eager'"),
    ({"max_batch_wait_ms": -1}, "max_batch_wait_ms must be a finite number of milliseconds >= 0, got -1"),
    ({"max_batch_wait_ms": float("nan")}, "max_batch_wait_ms must be a finite number of milliseconds >= 0"),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "uni"},
     r"tensor_parallel_size \* pipeline_parallel_size = 2 workers need distributed_executor_backend mp or ray"),
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size must be a positive integer, got 0"),
    ({"data_parallel_routing": "random"}, "data_parallel_routing must be one of cache_aware, round_robin"),
    ({"speculative_config": '{"method": "ngram"'}, "speculative_config must be a JSON object"),
    ({"speculative_config": {"method": "ngram", "k": 3}}, r"unknown key\(s\) \['k'\]"),
    ({"speculative_config": {"method": "ngram"}}, "missing 1 required positional argument: 'num_speculative_tokens'"),
    ({"speculative_config": {"method": "lookahead", "num_speculative_tokens": 2}}, "speculative method must be"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": "many"}},
     "num_speculative_tokens must be a positive integer or 'auto', got 'many'"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 0}},
     "num_speculative_tokens must be a positive integer, got 0"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 1000}},
     "num_speculative_tokens must be at most 32 .*, got 1000; or 'auto'"),
    ({"speculative_config": {"method": "draft_model", "num_speculative_tokens": 2}},
     "'draft_model' needs a 'model' .* or 'num_layers'"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "num_layers": 4}},
     "num_layers makes the target's first layers the draft: it needs method 'draft_model' and no 'model'"),
    ({"speculative_config": {"method": "medusa", "num_speculative_tokens": 2}},
     "'medusa' needs a 'model': the folder `jido train-draft --method medusa` wrote"),
    ({"kv_transfer_config": {"kv_connector": "shm", "kv_role": "sender"}}, "kv_role must be one of"),
    ({"kv_transfer_config": {"kv_connector": "rdma"}}, "kv_connector must be one of shm, tcp"),
    ({"kv_transfer_config": {"kv_connector": "nixl"}}, "kv_connector 'nixl' is not built"),
    ({"kv_transfer_config": {"kv_connector": "tcp", "kv_mode": "teleport"}}, "kv_mode must be one of pull, push"),
    ({"kv_transfer_config": {"kv_connector": "tcp", "kv_port": 70000}}, "kv_port must be a TCP port"),
    ({"kv_transfer_config": {"kv_connector": "tcp", "kv_lease_s": 0}}, "kv_lease_s must be a positive number"),
    ({"kv_transfer_config": {"kv_connector": "tcp", "kv_buffer_size": "lots"}}, "kv_buffer_size: cannot read size"),
    ({"kv_offload": {}}, "kv_offload needs at least one tier: 'cpu', 'disk' or 'remote'"),
    ({"kv_offload": {"gpu": "1GiB"}}, r"kv_offload: unknown key\(s\) \['gpu'\]"),
    ({"kv_offload": {"cpu": "lots"}}, "kv_offload.cpu: cannot read size 'lots'"),
    ({"kv_offload": {"cpu": {"size": "1GiB", "codec": "zip"}}}, "kv_offload.cpu.codec must be one of raw, int8, "
                                                                 "cachegen, got 'zip'"),
    ({"kv_offload": {"disk": {"size": "1GiB"}}}, r"kv_offload.disk needs a 'path'"),
    ({"kv_offload": {"disk": "/tmp/kv"}}, "kv_offload.disk must be an object like"),
    ({"kv_offload": {"remote": "http://127.0.0.1:6379"}}, "kv_offload.remote must be a redis://host:port URL"),
    ({"kv_offload": {"remote": {"url": "redis://h:1", "timeout_s": 0}}}, "timeout_s must be a positive number"),
    ({"scheduling_policy": "sjf"}, r"scheduling_policy must be one of \['fcfs', 'lpm', 'priority'\], got 'sjf'"),
    ({"preemption_mode": "drop"}, r"preemption_mode must be one of \['recompute', 'swap'\], got 'drop'"),
    ({"batch_invariant": "yes"}, "batch_invariant must be True or False, got 'yes'"),
    ({"batch_invariant": True, "attention_backend": "torch"},
     "batch_invariant attends every row with the tiled backend's C\\+\\+ kernel; attention_backend 'torch' has no "
     "batch-invariant route"),
    ({"batch_invariant": True, "quantization": "gguf_w8a8"}, "gguf_w8a8's prefill copy would never be used"),
])
def test_bad_values_are_refused_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(**kwargs)


def test_kv_transfer_and_kv_offload_together_are_refused_the_engine_runs_one_connector():
    from jido.kvtransfer.factory import connector_name
    config = EngineConfig.from_kwargs(kv_transfer_config={"kv_connector": "tcp"}, kv_offload={"cpu": "1GiB"})
    with pytest.raises(ValueError, match="set one of them"):
        connector_name(config)


def test_json_configs_are_read_from_text_or_dicts():
    config = EngineConfig.from_kwargs(speculative_config='{"method": "ngram", "num_speculative_tokens": 3}')
    assert config.speculative_config == SpeculativeConfig("ngram", 3)


def test_kv_offload_tiers_come_in_search_order_with_their_codecs():
    config = EngineConfig.from_kwargs(kv_offload='{"remote": "redis://127.0.0.1:6379", "codec": "int8", '
                                                 '"disk": {"path": "/tmp/kv", "size": "1GiB", "codec": "cachegen"}, '
                                                 '"cpu": "2GiB"}')
    assert [(t.name, t.size_bytes, t.codec) for t in config.kv_offload.tiers] == [
        ("cpu", 2 * 2**30, "int8"), ("disk", 2**30, "cachegen"), ("remote", None, "int8")]


def test_serve_has_one_flag_per_engine_setting():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {option for action in serve._actions for option in action.option_strings}
    assert {"--" + name.replace("_", "-") for name in engine_keywords()} <= flags
    args = build_parser().parse_args(["serve", "--distributed-executor-backend", "mp", "--no-enable-prefix-caching",
                                      "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert args.distributed_executor_backend == "mp" and args.enable_prefix_caching is False
