"""Past one machine, simulated as Ray's own tests do (`ray.cluster_utils.Cluster`): a head and a worker node on this
machine, one replica placed on each (`max_replicas_per_node=1`), and requests through the head's proxy served by
both."""

import json
import socket
import urllib.request

import pytest

from conftest import confident_model, tiny_tokenizer

ray = pytest.importorskip("ray", reason='the serve extra: pip install ".[serve]"')
serve = pytest.importorskip("ray.serve")


def test_two_nodes_each_serve_a_replica(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    from vanilla_transformer.tools.serving import ServedModel, build_application

    folder = tmp_path / "model"
    confident_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Every node runs on this one machine, so the head's proxy would keep to its own node's replica (Ray Serve
    # prefers local replicas); a real cluster has a proxy on each node.
    monkeypatch.setenv("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        assert len([node for node in ray.nodes() if node["Alive"]]) == 2
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        serve.run(build_application(ServedModel.from_folder(folder, languages=("en", "de")), num_replicas=2,
                                    max_replicas_per_node=1, threads=1), name="translation", route_prefix="/")
        served_by = set()
        for i in range(40):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/translate", headers={"Content-Type": "application/json"},
                data=json.dumps({"q": f"w{4 + i % 20} w5", "source": "en", "target": "de"}).encode())
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200 and json.loads(response.read())["translatedText"] is not None
                served_by.add(response.headers["x-served-by"].split("/")[0])
            if len(served_by) == 2:
                break
        assert len(served_by) == 2, f"every request went to the node {served_by}"
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
