"""Native tests of the config-reloader's logic: `python3 -m pytest plugins/config-reloader-py`."""

import json

from reloader import config_hash, configmaps_used


def test_every_way_a_pod_reads_a_configmap_is_found():
    spec = {
        "volumes": [
            {"name": "a", "configMap": {"name": "vol"}},
            {"name": "b", "projected": {"sources": [{"configMap": {"name": "proj"}}, {"secret": {"name": "s"}}]}},
            {"name": "c", "emptyDir": {}},
        ],
        "containers": [{
            "name": "app",
            "envFrom": [{"configMapRef": {"name": "envfrom"}}, {"secretRef": {"name": "s2"}}],
            "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "keyref", "key": "k"}}},
                {"name": "Y", "value": "plain"},
            ],
        }],
        "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "init"}}]}],
    }
    assert configmaps_used(spec) == ["envfrom", "init", "keyref", "proj", "vol"]
    assert configmaps_used({}) == []


def test_the_hash_follows_data_and_nothing_else():
    stored = {"a": {"metadata": {"resourceVersion": "1"}, "data": {"k": "v"}}}
    read = lambda n: json.dumps(stored[n]) if n in stored else None
    first = config_hash(["a"], read)
    assert len(first) == 64
    stored["a"]["metadata"]["resourceVersion"] = "2"
    assert config_hash(["a"], read) == first, "metadata must not roll the Pods"
    stored["a"]["data"]["k"] = "w"
    changed = config_hash(["a"], read)
    assert changed != first
    # A ConfigMap that appears later changes the hash too.
    missing = config_hash(["a", "b"], read)
    stored["b"] = {"data": {}}
    assert config_hash(["a", "b"], read) != missing
