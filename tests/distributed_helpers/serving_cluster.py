#!/usr/bin/env python
"""A saved model (argv[1]) served by two Ray nodes on this machine, as Ray's own tests simulate a cluster
(`ray.cluster_utils.Cluster`), one replica placed on each, for tests/test_serving_cluster.py. Ray Serve reads its
ingress (RAY_SERVE_ENABLE_HA_PROXY) when it is imported, so each ingress runs in a process of its own, started with
the variables that `ray start` would get on a real cluster. Prints the nodes that answered, one line of JSON."""

import json
import socket
import sys
import urllib.request

import ray
from ray import serve
from ray.cluster_utils import Cluster

from vanilla_transformer.tools.serving import ServedModel, build_application


def main(folder: str):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        alive = len([node for node in ray.nodes() if node["Alive"]])
        # Every node is this one machine, where only the head may bind the port; a real cluster has an ingress on each.
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
        print(json.dumps({"nodes": alive, "served_by": sorted(served_by)}), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
