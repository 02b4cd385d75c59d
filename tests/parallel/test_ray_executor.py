"""The Ray executor on a two-node Ray cluster on 127.0.0.1 (started and stopped here): TP=2 with one rank on
each node gives the single-process greedy tokens, offline and served."""
from __future__ import annotations

import json
import os
import sys

import pytest

# Ray picks 127.0.0.1 as every node's address with this (on Linux it would take the machine's interface).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from parallel_prompts import GREEDY, PROMPTS  # noqa: E402
from jido import LLM  # noqa: E402
from server_harness import running_server  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and a worker node of one CPU each, so that the two ranks' bundles cannot share a node."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, log_to_driver=False)
    # Ray's workers cannot import this test module: the functions sent to them travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def node_id(worker: object) -> str:
    return ray.get_runtime_context().get_node_id()


def test_tensor_parallel_across_two_ray_nodes_gives_the_single_process_tokens(two_node_cluster, family_folder,
                                                                              single_process_tokens):
    llm = LLM(str(family_folder("llama")), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2,
              distributed_executor_backend="ray")
    try:
        nodes = llm.collective_rpc(node_id)
        assert len(set(nodes)) == 2 and set(nodes) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == single_process_tokens("llama")
        with running_server(engine=llm.llm_engine) as server:
            status, _, body = server.request("POST", "/v1/completions", {
                "prompt": PROMPTS[0], "max_tokens": GREEDY.max_tokens, "temperature": 0})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == outputs[0].outputs[0].text
    finally:
        llm.shutdown()
