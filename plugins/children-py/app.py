"""children-py: a test plugin in Python that uses what contract 0.3 adds.

For each ConfigMap labelled `wcm.test/py-children`, it returns one child ConfigMap
`NAME-X` per entry X of the comma-separated `data.children` (the host applies them and prunes the
ones no longer returned), adds the number of children to its counter `children{lang="python"}`,
and declares a schedule (`hourly`, in Europe/Berlin) whose tick reconciles every primary.

Built with componentize-py against `wit/` (`wcm:reconciler@0.3.0`).
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import metrics, types

CONFIGMAP = types.KindRef(group="", version="v1", kind="ConfigMap")


def _watch(selector=None):
    return types.Watch(kind=CONFIGMAP, namespace=None, label_selector=selector, metadata_only=False)


def _done(children=None):
    return types.Outcome(action=types.Action_Done(), children=children)


class Reconciler(exports.Reconciler):
    def describe(self):
        return types.Description(
            name="children-py",
            version="0.1.0",
            primary=_watch("wcm.test/py-children"),
            # A child's change wakes its primary.
            secondaries=[types.Secondary(watch=_watch(), mapping=types.Mapping_ControllerOwner())],
            resync_seconds=None,
            workers=None,
            permissions=[
                types.Permission(
                    group="",
                    resource="configmaps",
                    verbs=["get", "list", "create", "patch", "delete"],
                ),
            ],
            outbound_hosts=[],
            config_keys=[],
            extensions=[],
            schedules=[
                types.Schedule(
                    name="hourly",
                    cron="@hourly",
                    time_zone="Europe/Berlin",
                    key=None,
                    jitter_seconds=30,
                    catch_up_seconds=600,
                ),
            ],
            metrics=[
                types.Metric(
                    name="children",
                    help="Children returned, by language.",
                    kind=types.MetricKind.COUNTER,
                    labels=["lang"],
                    buckets=[],
                ),
            ],
            propagate_trace_context=False,
        )

    def reconcile(self, req):
        if req.object is None:
            return _done()
        primary = json.loads(req.object)
        name = (primary.get("metadata") or {}).get("name", "")
        wanted = [c.strip() for c in (primary.get("data") or {}).get("children", "").split(",")]
        children = [
            types.Child(
                kind=CONFIGMAP,
                object=json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"{name}-{c}"},
                        "data": {"from": "python"},
                    }
                ),
                force=True,
            )
            for c in wanted
            if c
        ]
        try:
            metrics.add("children", ["python"], float(len(children)))
        except Err:
            # Refused (counted by the host); the reconcile goes on.
            pass
        return _done(children)
