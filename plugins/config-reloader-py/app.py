"""config-reloader: rolls a Deployment when a ConfigMap it uses changes.

A Deployment labelled `config-reloader.wcm.io/enabled=true` gets the annotation
`config-reloader.wcm.io/config-hash` on its Pod template: a SHA-256 of the ConfigMaps its Pods use
(volumes, envFrom, env valueFrom). When one of them changes, the hash changes, and the Deployment
rolls its Pods. A ConfigMap labelled `config-reloader.wcm.io/deployment=NAME` wakes Deployment NAME
at once; any other change is seen within the resync period.

Written in Python, built with componentize-py against the same WIT world as the Rust plugins.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import cache, client, events, log, types

from reloader import config_hash, configmaps_used

VERSION = "0.1.0"
ENABLED = "config-reloader.wcm.io/enabled"
HASH = "config-reloader.wcm.io/config-hash"
WAKES = "config-reloader.wcm.io/deployment"

DEPLOYMENT = types.KindRef(group="apps", version="v1", kind="Deployment")
CONFIGMAP = types.KindRef(group="", version="v1", kind="ConfigMap")


def _watch(kind, selector=None):
    return types.Watch(kind=kind, namespace=None, label_selector=selector, metadata_only=False)


class Reconciler(exports.Reconciler):
    def describe(self):
        mappings = {"secondaries": [{"label": WAKES}]}
        return types.Description(
            name="config-reloader",
            version=VERSION,
            primary=_watch(DEPLOYMENT, ENABLED + "=true"),
            secondaries=[
                # The 0.1 mapping (same name) is the fallback of a host without the extension.
                types.Secondary(watch=_watch(CONFIGMAP), mapping=types.Mapping_SameKey()),
            ],
            resync_seconds=300,
            workers=None,
            permissions=[
                types.Permission(group="apps", resource="deployments", verbs=["patch"]),
            ],
            outbound_hosts=[],
            config_keys=[],
            extensions=[
                ("mappings", json.dumps(mappings)),
                # CPython costs milliseconds per fresh instance and microseconds warm, and this
                # plugin keeps nothing between keys: a warm instance per worker by default.
                ("isolation", json.dumps("worker")),
            ],
        )

    def reconcile(self, req):
        if req.object is None:
            return types.Action_Done()
        deployment = json.loads(req.object)
        meta = deployment.get("metadata") or {}
        namespace = meta.get("namespace")
        name = meta.get("name")
        template = (deployment.get("spec") or {}).get("template") or {}
        names = configmaps_used(template.get("spec") or {})
        # From the host's cache: no API call.
        wanted = config_hash(
            names, lambda n: cache.get(CONFIGMAP, types.ObjectKey(namespace=namespace, name=n))
        )
        current = ((template.get("metadata") or {}).get("annotations") or {}).get(HASH)
        if current == wanted:
            return types.Action_Done()
        patch = {"spec": {"template": {"metadata": {"annotations": {HASH: wanted}}}}}
        key = types.ObjectKey(namespace=namespace, name=name)
        try:
            client.patch(DEPLOYMENT, key, client.PatchType.STRATEGIC, json.dumps(patch))
        except Err as e:
            error = e.value
            # 404: deleted meanwhile; the next change of the cache says so. Others are retried.
            if error.code == 404:
                return types.Action_Done()
            raise Err(types.ReconcileError(
                message=f"patching deployment {namespace}/{name}: {error.code} {error.reason}: {error.message}",
                terminal=False,
            ))
        log.log(log.Level.INFO, "config hash set", [
            ("deployment", f"{namespace}/{name}"),
            ("configmaps", ",".join(names)),
            ("hash", wanted[:12]),
        ])
        if current is not None:
            regarding = events.ObjectRef(kind=DEPLOYMENT, key=key, uid=meta.get("uid"))
            events.record(
                regarding, events.EventType.NORMAL, "ConfigChanged", "RollOut",
                "ConfigMaps " + ", ".join(names) + " changed: rolling the Pods",
            )
        return types.Action_Done()
