from __future__ import annotations

import pytest

from jido.planner.design_space import Config, ConfigError, SearchSpace, enumerate_space, prune_reason
from jido.planner.roofline import Role

SMALL = SearchSpace(accelerators=("A100-80G", "H100-SXM"), weight_precisions=("bf16", "fp8"),
                    kv_precisions=("bf16",), links=("nvlink", "infiniband"), wires=("raw",),
                    residencies=("hbm",), ownerships=("push",))


def test_small_space_counts_and_reasons(catalog):
    result = enumerate_space(SMALL, catalog)
    # 3 supported roles (A100 bf16, H100 bf16, H100 fp8) + 1 unsupported; 16 role pairs
    assert result.pruned["A100-80G has no fp8 tensor cores"] == 7 * 3
    assert result.pruned["different accelerator types sit on different servers: no shared NVLink domain"] == 4
    assert result.pruned["a co-located pool runs both phases on one accelerator type and precision"] == 6
    assert len(result.configs) == 3 + 9 * 2 - 4
    assert sum(result.pruned.values()) + len(result.configs) == 16 * 3


def test_every_pruned_reason_has_an_example_label(catalog):
    result = enumerate_space(SMALL, catalog)
    for reason in result.pruned:
        assert prune_reason(Config.parse(result.examples[reason]), catalog) == reason


@pytest.mark.parametrize("label, reason", [
    ("p=L4,d=L4,link=nvlink", "L4 has no NVLink-class scale-up link"),
    ("p=H100-SXM:bf16:fp8,d=H100-SXM,link=infiniband,wire=quantized",
     "KV is already 8-bit at prefill: quantizing for the wire changes nothing"),
    ("p=H100-SXM,d=H100-SXM,link=infiniband,wire=compressed",
     "compression codec is no faster than the link: compressing can only add time"),
    ("p=cpu-2core,d=H100-SXM,link=pcie", "a CPU-only node has no accelerator link: prefill and decode must "
                                        "talk over a network"),
    ("pool=cpu-2core,kv=cpu-dram", "cpu-2core memory is CPU DRAM already: 'cpu-dram' is the same as 'hbm'"),
])
def test_pruning_reasons(catalog, label, reason):
    assert prune_reason(Config.parse(label), catalog) == reason


def test_compression_is_kept_on_slow_links(catalog):
    assert prune_reason(Config.parse("p=H100-SXM,d=A100-80G,link=ethernet,wire=compressed"), catalog) is None


def test_label_round_trips():
    config = Config("disaggregated", Role("H100-SXM", "fp8", "fp8"), Role("A100-80G"), "cpu-dram",
                    "infiniband", "quantized", "pull")
    assert Config.parse(config.label) == config
    assert config.is_heterogeneous
    pool = Config.parse("pool=L40S:fp8")
    assert pool.placement == "colocated" and pool.label == "pool=L40S:fp8:bf16,kv=hbm"


def test_bad_labels_say_what_is_expected():
    with pytest.raises(ConfigError, match="needs pool=ROLE, or p=ROLE,d=ROLE,link=LINK"):
        Config.parse("p=H100-SXM")
    with pytest.raises(ConfigError, match="unknown keys"):
        Config.parse("pool=H100-SXM,color=red")
    with pytest.raises(ValueError, match="weight_precision must be one of"):
        Config.parse("pool=H100-SXM:fp4")
