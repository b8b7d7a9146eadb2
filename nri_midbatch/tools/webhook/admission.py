"""Admission decisions for Pods: AdmissionReview bytes in, (HTTP status, response body) out.

Pure: no sockets, no clock, no logging. The server calls `handle` and writes what it returns.

Mutation (CREATE only) brings to the node what kubelet drops: the pod's priority class, as the
priority-class label, and the tier resources of every container, as the extended-resource spec
annotation. Validation rejects pods the tiers cannot serve as asked, and on UPDATE any change of
the labels and the annotation the node reads: the runtime snapshots them when it creates the
sandbox, so a later change would only make the API and the node disagree.

Errors in the envelope (not JSON, not an admission.k8s.io/v1 AdmissionReview, no request or
no request.uid) are HTTP 400: there is no uid to answer to, and the API server treats the call
as failed and applies the webhook's failurePolicy. A well-formed review whose object cannot be
read (not a Pod, a field of the wrong shape) gets an explicit denial with code 400 and the
reason, echoing the uid, so the user sees why instead of the failure policy deciding silently.

Linear in the number of containers: the pod is read once, its spec derived once, and the
node's policy classifies it (parsing the spec) once for all its containers. A review also
carries a time budget (budget.py), checked as the containers are walked; a review that spends
it is answered as the webhook's failure policy would decide (`over_budget`).

Longer than the house's 400 lines: mutation and validation share the classification and
the walk over every container's resources, and stay pure together.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from nri_midbatch.policy import (
    ContainerView,
    Decision,
    ErrorKind,
    PodView,
    Policy,
    PriorityClass,
    QoSClass,
    Source,
    Tier,
    classify_pod,
    decide_container,
    decide_pod,
)
from nri_midbatch.policy.bounded_cache import INPUT_CACHE_BYTES, BoundedCache
from nri_midbatch.policy.classes import forbidden_combination, priority_class_from_value
from nri_midbatch.policy.quantity import Format, Quantity

from . import jsonpatch
from .budget import UNLIMITED, Budget, OverBudget
from .jsonpatch import Op
from .pods import PodError, PodFacts, cgroup_parent, read_pod

__all__ = [
    "ADMISSION_API_VERSION",
    "Answer",
    "Classification",
    "Endpoint",
    "ReviewError",
    "Verdict",
    "classify",
    "derive_spec",
    "handle",
    "mutate",
    "over_budget",
    "validate",
]

ADMISSION_API_VERSION = "admission.k8s.io/v1"
#: A denial lists at most this many of the node's errors (one per container at worst), then
#: how many more there are: the message stays short whatever the pod's size.
MAX_LISTED_ERRORS = 10
Endpoint = Literal["mutate", "validate"]


class ReviewError(ValueError):
    """The body is not an AdmissionReview the webhook can answer (HTTP 400)."""

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    patch: tuple[Op, ...] = ()
    message: str = ""
    # Status code and reason of a denial: 403 Forbidden for policy, 400 BadRequest for input.
    code: int = 200
    reason: str = ""
    warnings: tuple[str, ...] = ()
    # For the log only: what the webhook made of the pod.
    tier: str | None = None


@dataclass(frozen=True, slots=True)
class Classification:
    priority: PriorityClass | None
    qos: QoSClass | None
    tier: Tier | None
    # The priority-class label is present with a value Koordinator does not know.
    unknown_priority_label: str | None = None
    # The QoS class came from the QoS label (not from the Kubernetes QoS class).
    qos_labelled: bool = False


@dataclass(slots=True)
class _Request:
    uid: str
    operation: str
    namespace: str
    raw: dict[str, Any] = field(default_factory=dict)


# -- entry point ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """What to send back, and what happened, for the server's log."""

    status: int
    body: dict[str, Any]
    verdict: Verdict | None = None
    uid: str | None = None
    operation: str = ""
    namespace: str = ""
    name: str = ""
    error: str | None = None
    #: The review spent its budget and was answered by `over_budget`.
    over_budget: bool = False


def handle(body: bytes, endpoint: Endpoint, policy: Policy, budget: Budget = UNLIMITED) -> Answer:
    """Answer one AdmissionReview; never raises for any input; stops when `budget` is spent."""
    try:
        request = _read_review(body)
    except ReviewError as error:
        reply: dict[str, Any] = {"error": str(error)}
        if error.uid is not None:
            reply["uid"] = error.uid
        return Answer(400, reply, uid=error.uid, error=str(error))
    spent = None
    try:
        verdict = _dispatch(request, endpoint, policy, budget)
    except PodError as error:
        verdict = Verdict(False, message=f"cannot admit: {error}", code=400, reason="BadRequest")
    except OverBudget as error:
        spent = error
        verdict = over_budget(endpoint, request.operation, error)
    obj = request.raw.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = ""
    if isinstance(metadata, dict):
        name = str(metadata.get("name") or metadata.get("generateName") or "")
    return Answer(
        200,
        response(request.uid, verdict),
        verdict,
        request.uid,
        request.operation,
        request.namespace,
        name,
        over_budget=spent is not None,
    )


def response(uid: str, verdict: Verdict) -> dict[str, Any]:
    answer: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(
            json.dumps(list(verdict.patch), separators=(",", ":")).encode()
        ).decode("ascii")
    if not verdict.allowed:
        answer["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason,
            "message": verdict.message,
        }
    if verdict.warnings:
        answer["warnings"] = list(verdict.warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": answer}


def _read_review(body: bytes) -> _Request:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise ReviewError(f"the body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ReviewError("the body must be a JSON object: an AdmissionReview")
    request = document.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    uid = uid if isinstance(uid, str) and uid else None
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if api_version != ADMISSION_API_VERSION or kind != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion {ADMISSION_API_VERSION} and kind AdmissionReview, "
            f"got apiVersion {api_version!r} and kind {kind!r}",
            uid,
        )
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request object")
    if uid is None:
        raise ReviewError("request.uid is missing or not a non-empty string")
    operation = request.get("operation")
    namespace = request.get("namespace")
    return _Request(
        uid=uid,
        operation=operation if isinstance(operation, str) else "",
        namespace=namespace if isinstance(namespace, str) else "",
        raw=request,
    )


def over_budget(endpoint: Endpoint, operation: str, spent: OverBudget) -> Verdict:
    """The answer to a review that spent its budget: what the API server would decide on a
    timeout under the failure policies of examples/kubernetes/webhook, said explicitly and
    at once. Only validation of CREATE fails closed; the rest admit the pod unchanged.
    """
    what = f"nri-midbatch webhook: {spent}"
    if endpoint == "validate" and operation == "CREATE":
        return Verdict(
            False,
            message=f"{what}; pod creation is refused (validation fails closed)",
            code=504,
            reason="Timeout",
        )
    if endpoint == "validate":
        return Verdict(True, warnings=(f"{what}; the update is admitted unchecked",))
    return Verdict(
        True, warnings=(f"{what}; the pod is admitted without its tier label and resources",)
    )


def _dispatch(request: _Request, endpoint: Endpoint, policy: Policy, budget: Budget) -> Verdict:
    raw = request.raw
    if raw.get("subResource"):
        # pods/status, pods/resize, ...: not the object whose labels the node reads.
        return Verdict(True)
    _check_kind(raw)
    if request.operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise PodError(f"request.operation {raw.get('operation')!r} is not an admission operation")
    if request.operation in ("DELETE", "CONNECT"):
        return Verdict(True)
    pod = read_pod(raw.get("object"), request.namespace, "request.object", budget)
    if request.operation == "UPDATE":
        if endpoint == "mutate":
            # Koordinator writes the annotation at creation only, and validation keeps the
            # label and annotation immutable: an UPDATE is never mutated.
            return Verdict(True)
        old = read_pod(raw.get("oldObject"), request.namespace, "request.oldObject", budget)
        return validate_update(old, pod, policy)
    if endpoint == "mutate":
        return mutate(pod, policy, budget)
    return validate(pod, policy, budget)


def _check_kind(raw: Mapping[str, Any]) -> None:
    kind = raw.get("kind")
    if not isinstance(kind, dict):
        raise PodError("request.kind is missing")
    group, version, name = kind.get("group", ""), kind.get("version"), kind.get("kind")
    if (group, version, name) != ("", "v1", "Pod"):
        raise PodError(
            f"request.kind is {group or 'core'}/{version}/{name}: this webhook only admits v1 Pods"
        )


# -- classification ------------------------------------------------------------


def classify(pod: PodFacts, policy: Policy) -> Classification:
    """Priority (label wins, else spec.priority), QoS (as the plugin reads it), then the tier."""
    classifier = policy.classifier
    settings = classifier.settings
    qos = classifier.qos(pod.labels, cgroup_parent(pod))
    unknown_label = None
    label = pod.labels.get(settings.priority_class_label)
    if label is not None:
        # Exactly the plugin's reading of the label; an unknown value is no class, no fallback.
        found = classifier.priority(pod.labels, qos.value, None)
        priority = found.value
        if priority is None:
            unknown_label = label
    elif pod.priority is not None:
        priority = priority_class_from_value(pod.priority)
    else:
        priority = None
    match = policy.chain.select(priority, qos.value, pod.namespace)
    return Classification(
        priority,
        qos.value,
        match.tier,
        unknown_label,
        qos.source is Source.LABEL,
    )


def tier_resources(policy: Policy) -> tuple[str, ...]:
    """Every resource a tier reads, in a stable order."""
    return tuple(
        sorted(
            {
                name
                for t in policy.chain.tiers
                for name in (t.cpu_resource, t.memory_resource)
                if name  # tiers whose calculator reads none
            }
        )
    )


def derive_spec(
    pod: PodFacts, resources: tuple[str, ...], budget: Budget = UNLIMITED
) -> dict[str, Any] | None:
    """The extended-resource spec a pod's containers call for, or None when they name none.

    Like Koordinator's webhook: app containers only, containers without the resources left
    out, quantities in canonical form. A resource with only a limit gets the limit as its
    request, as the API server's defaulting and Koordinator's colocation-profile webhook do.
    """
    containers: dict[str, Any] = {}
    for container in pod.containers:
        budget.check()
        limits = {n: _canonical(container.limits[n]) for n in resources if n in container.limits}
        requests = {
            n: _canonical(container.requests[n]) for n in resources if n in container.requests
        }
        for name, limit in limits.items():
            requests.setdefault(name, limit)
        entry: dict[str, Any] = {}
        if limits:
            entry["limits"] = limits
        if requests:
            entry["requests"] = dict(sorted(requests.items()))
        if entry:
            containers[container.name] = entry
    return {"containers": containers} if containers else None


def _canonical(quantity: Quantity) -> str:
    amount = quantity.amount
    return _canonical_form((amount.numerator, amount.denominator, quantity.format))


#: An amount as its numerator and denominator, and the format it was written in.
_CanonicalKey = tuple[int, int, Format]


def _canonical_text(key: _CanonicalKey) -> str:
    """Kubernetes' canonical text of a quantity; cached, as a pod's quantities repeat.

    Keyed by amount and format, not by Quantity: quantities compare by amount alone, but
    "1Ki" and "1024" are written differently. An amount a pod author writes can be long.
    The amount is two ints, not a Fraction: a Fraction's hash and == are Python code, run
    inside the cache's C lookups, where they let other threads in (see bounded_cache).
    """
    numerator, denominator, written = key
    return str(Quantity(Fraction(numerator, denominator), written))


canonical_cache = BoundedCache[_CanonicalKey, str](1024, INPUT_CACHE_BYTES)
_canonical_form = canonical_cache.memoize(_canonical_text)


def encode_spec(spec: Mapping[str, Any]) -> str:
    """Go's json.Marshal form: keys sorted, no spaces (what Koordinator's webhook writes)."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


# -- mutation ------------------------------------------------------------------


def mutate(pod: PodFacts, policy: Policy, budget: Budget = UNLIMITED) -> Verdict:
    found = classify(pod, policy)
    warnings: list[str] = []
    settings = policy.classifier.settings
    if found.unknown_priority_label is not None:
        warnings.append(
            f"label {settings.priority_class_label}={found.unknown_priority_label!r} is not a "
            "Koordinator priority class: the pod is in no tier"
        )
    tier = found.tier
    if tier is None or found.priority is None:
        return Verdict(True, warnings=tuple(warnings))
    spec = derive_spec(pod, tier_resources(policy), budget)
    unusable = node_errors(pod, found, spec, policy, budget)
    if unusable:
        # Validation denies the pod; a patch would only carry the values to a node that
        # refuses them.
        return Verdict(True, warnings=(*warnings, *unusable), tier=tier.name)
    ops: list[Op] = []
    _set_entry(
        ops,
        "labels",
        pod.has_labels,
        pod.labels,
        settings.priority_class_label,
        found.priority.value,
    )
    if not tier.cpu_resource:  # its calculator reads no extended resources: no spec to write
        return Verdict(True, tuple(ops), warnings=tuple(warnings), tier=tier.name)
    key = settings.spec_annotation
    current = pod.annotations.get(key)
    if spec is None:
        if current is not None and _names_containers(current):
            ops.append(jsonpatch.remove(jsonpatch.pointer("metadata", "annotations", key)))
        warnings.append(
            f"{found.priority} pod requests none of {tier.cpu_resource}, "
            f"{tier.memory_resource}: its cgroups stay as kubelet sets them"
        )
    elif current is None or _load(current) != spec:
        _set_entry(ops, "annotations", pod.has_annotations, pod.annotations, key, encode_spec(spec))
    return Verdict(True, tuple(ops), warnings=tuple(warnings), tier=tier.name)


def _set_entry(
    ops: list[Op], field_name: str, exists: bool, current: Mapping[str, str], key: str, value: str
) -> None:
    if not exists:
        ops.append(jsonpatch.add(jsonpatch.pointer("metadata", field_name), {key: value}))
    elif key not in current:
        ops.append(jsonpatch.add(jsonpatch.pointer("metadata", field_name, key), value))
    elif current[key] != value:
        ops.append(jsonpatch.replace(jsonpatch.pointer("metadata", field_name, key), value))


_UNREADABLE = object()


def _load(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNREADABLE


def node_errors(
    pod: PodFacts,
    found: Classification,
    spec: Mapping[str, Any] | None,
    policy: Policy,
    budget: Budget = UNLIMITED,
) -> list[str]:
    """Why the node would refuse the tier values of the pod's containers, if it would.

    The node's own policy core decides, on the annotation mutation writes (`spec`, from
    derive_spec): a quantity beyond int64, or a cgroup value computed from it beyond int64
    (1e18 cores), is an error there. Native limits are taken as absent, which can only find
    more errors than the node. The pod is classified, and the annotation parsed, once for
    all its containers. At most MAX_LISTED_ERRORS distinct errors are listed, then a count.
    """
    if spec is None or found.tier is None or found.priority is None:
        return []
    settings = policy.classifier.settings
    view = PodView(
        uid="",
        namespace=pod.namespace,
        name=pod.name,
        labels={**pod.labels, settings.priority_class_label: found.priority.value},
        annotations={settings.spec_annotation: encode_spec(spec)},
        cgroup_parent=cgroup_parent(pod),
    )
    pod_class = classify_pod(view, policy)
    # Distinct errors in the order found (a dict: a list's membership test is O(n) each).
    errors: dict[str, None] = {}

    def note(where: str, decision: Decision) -> None:
        if decision.error is None:
            return
        # A spec error names its container already; an overflow does not.
        overflow = decision.error_kind is ErrorKind.OVERFLOW
        errors[where + decision.error if overflow else decision.error] = None

    for name in sorted(spec["containers"]):
        budget.check()
        note(
            f"container {name!r}: ",
            decide_container(view, ContainerView("", name), policy, pod_class),
        )
    note("pod level: ", decide_pod(view, policy, pod_class))
    listed = [f"the node cannot use the tier resources: {error}" for error in errors]
    if len(listed) > MAX_LISTED_ERRORS:
        more = len(listed) - MAX_LISTED_ERRORS
        listed = [*listed[:MAX_LISTED_ERRORS], f"and {more} more errors of the node's"]
    return listed


def _names_containers(text: str) -> bool:
    """False for an annotation the plugin reads as "no spec": null, {} or empty containers."""
    document = _load(text)
    return not (document is None or (isinstance(document, dict) and not document.get("containers")))


# -- validation ----------------------------------------------------------------


def validate(pod: PodFacts, policy: Policy, budget: Budget = UNLIMITED) -> Verdict:
    """CREATE: the priority x QoS matrix and each tier's resources against priority and QoS.

    The matrix applies to the QoS label only, as in Koordinator's validating webhook; a QoS
    class taken from the Kubernetes QoS class (classification.qosFromCgroupParent) was not
    asked for, and a pod it puts outside every tier is merely left alone. The resource rules
    use the QoS class the plugin will use, labelled or not.
    """
    found = classify(pod, policy)
    problems: list[str] = []
    combination = forbidden_combination(found.priority, found.qos if found.qos_labelled else None)
    if combination is not None:
        problems.append(combination)
    settings = policy.classifier.settings
    for tier in policy.chain.tiers:
        used = _requested(pod, (tier.cpu_resource, tier.memory_resource))
        if not used:
            continue
        names = "resources " + ", ".join(used) + f" (tier {tier.name})"
        if found.qos not in tier.qos_classes:
            problems.append(
                f"{names} need QoS class {' or '.join(sorted(map(str, tier.qos_classes)))} in "
                "label "
                f"{settings.qos_label}, but the pod's QoS class is {found.qos or 'none'}"
            )
        if found.priority is not None and found.priority not in tier.priority_classes:
            problems.append(
                f"{names} are for priority class {' or '.join(map(str, tier.priority_classes))}, "
                f"but the pod's priority class is {found.priority}"
            )
    if problems:
        return Verdict(
            False, message="; ".join(problems), code=403, reason="Forbidden", tier=_name(found)
        )
    unusable = node_errors(
        pod, found, derive_spec(pod, tier_resources(policy), budget), policy, budget
    )
    if unusable:
        return Verdict(
            False, message="; ".join(unusable), code=400, reason="BadRequest", tier=_name(found)
        )
    return Verdict(True, tier=_name(found))


def validate_update(old: PodFacts, new: PodFacts, policy: Policy) -> Verdict:
    """UPDATE: the QoS and priority-class labels and the annotation cannot change."""
    settings = policy.classifier.settings
    problems: list[str] = []
    for what, key, before, after in (
        ("label", settings.qos_label, old.labels, new.labels),
        ("label", settings.priority_class_label, old.labels, new.labels),
        ("annotation", settings.spec_annotation, old.annotations, new.annotations),
    ):
        was, now = before.get(key), after.get(key)
        if was == now or (
            what == "annotation"
            and was is not None
            and now is not None
            and _load(was) is not _UNREADABLE
            and _load(was) == _load(now)
        ):
            continue
        problems.append(f"{what} {key} is immutable: {_shown(was)} -> {_shown(now)}")
    if problems:
        return Verdict(False, message="; ".join(problems), code=403, reason="Forbidden")
    return Verdict(True)


def _requested(pod: PodFacts, names: tuple[str, ...]) -> list[str]:
    """Which of the names any container (init containers too) requests or limits."""
    containers = (*pod.init_containers, *pod.containers)
    return [n for n in names if any(n in c.requests or n in c.limits for c in containers)]


def _name(found: Classification) -> str | None:
    return None if found.tier is None else found.tier.name


def _shown(value: str | None) -> str:
    if value is None:
        return "absent"
    return repr(value if len(value) <= 80 else value[:77] + "...")
