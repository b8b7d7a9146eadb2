"""The admission webhook: brings a pod's priority class and tier resources to the node.

Kubelet passes neither spec.priority nor extended resources to the runtime, and Koordinator's
webhook writes only batch resources into the extended-resource spec annotation. This webhook
writes the priority-class label and every tier's resources (batch and mid) at pod creation,
from the same configuration and policy core as the plugin, and rejects pods the tiers cannot
serve. `admission` decides (pure, within a `budget`), `pool` runs the decisions in bounded
worker threads, `server` serves HTTPS.
"""

from .admission import Answer, Verdict, classify, derive_spec, handle, mutate, validate
from .server import DEFAULT_ADDRESS, MAX_BODY_BYTES, WebhookServer

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_BODY_BYTES",
    "Answer",
    "Verdict",
    "WebhookServer",
    "classify",
    "derive_spec",
    "handle",
    "mutate",
    "validate",
]
