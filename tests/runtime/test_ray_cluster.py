"""The three-node Ray cluster the node-loss tests run on (ray_cluster.py): its nodes are
separate network hosts, engine actors land on the engine nodes, and their RPCs and KV moves
cross the veth links."""

import json
import sys


def test_engine_actors_land_on_the_engine_nodes_and_talk_across_the_veths(three_node_cluster, tiny_model_dir):
    cluster = three_node_cluster
    head, engine_nodes = cluster.head, cluster.nodes[1:]
    before = {node.name: cluster.veth_bytes(node) for node in engine_nodes}

    probe = cluster.run_in_head([sys.executable, "-m", "tests.runtime.cluster_probe", str(tiny_model_dir)],
                                timeout=300)

    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["driver"] == head.ip
    hosts = [engine["host"] for engine in result["engines"]]
    assert sorted(hosts) == sorted(node.ip for node in engine_nodes)  # one per engine node, none on the head
    assert [engine["address"][0] for engine in result["engines"]] == hosts  # served at the node's veth address
    assert result["moved_tokens"] == 40
    # the KV went from one engine node to the other: at least its bytes crossed each one's veth
    for node in engine_nodes:
        assert cluster.veth_bytes(node) - before[node.name] >= result["kv_bytes"]
