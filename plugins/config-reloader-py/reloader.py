"""The config-reloader's logic, free of the host: which ConfigMaps a Pod spec uses, and their hash.
Tested natively with pytest (test_reloader.py)."""

import hashlib
import json


def configmaps_used(pod_spec):
    """The names of the ConfigMaps a Pod spec reads, sorted."""
    names = set()
    for volume in pod_spec.get("volumes") or []:
        if "configMap" in volume:
            names.add(volume["configMap"].get("name"))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                names.add(source["configMap"].get("name"))
    containers = (pod_spec.get("containers") or []) + (pod_spec.get("initContainers") or [])
    for c in containers:
        for src in c.get("envFrom") or []:
            if "configMapRef" in src:
                names.add(src["configMapRef"].get("name"))
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                names.add(ref.get("name"))
    return sorted(n for n in names if n)


def config_hash(names, read):
    """SHA-256 over each named ConfigMap's name and data; `read(name)` gives its JSON or None."""
    digest = hashlib.sha256()
    for name in names:
        raw = read(name)
        digest.update(name.encode())
        digest.update(b"\0")
        if raw is None:
            # Missing hashes apart from empty: creating it later changes the hash.
            digest.update(b"missing")
        else:
            cm = json.loads(raw)
            body = {"data": cm.get("data") or {}, "binaryData": cm.get("binaryData") or {}}
            digest.update(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"\0")
    return digest.hexdigest()
