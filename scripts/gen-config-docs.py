#!/usr/bin/env python3
"""Generate docs/configuration.md from the pydantic models in nri_midbatch/config/model.py.

    .venv/bin/python scripts/gen-config-docs.py           # rewrite docs/configuration.md
    .venv/bin/python scripts/gen-config-docs.py --check   # exit 1 if it is stale

Every key's path, type, default, constraints and description come from the models (the
descriptions are the fields' `Field(description=...)`). A field without a description, a
constraint this script cannot put into words, or a validator it does not know makes it fail,
so the reference cannot silently fall behind the code. The prose around the reference is
kept here.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.functional_validators import AfterValidator
from pydantic.types import AllowInfNan, Strict, StringConstraints
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nri_midbatch.config import bounded_yaml  # noqa: E402
from nri_midbatch.config import model as config_module  # noqa: E402
from nri_midbatch.config.model import Config, effective_config_yaml  # noqa: E402

OUTPUT = ROOT / "docs" / "configuration.md"
COMMAND = ".venv/bin/python scripts/gen-config-docs.py"

#: Validators that look at more than one value, in words. Keyed by (model, function name).
VALIDATORS = {
    ("TierResources", "_distinct"): "`cpu` and `memory` must name different resources.",
    ("TierConfig", "_resources_fit_the_calculator"): (
        "`extended-resources` needs `resources`; `cpu-normalization` takes none."
    ),
    ("Config", "_tiers_are_unambiguous"): (
        "tier names must be unique; a (priority class, QoS class) pair may belong to one tier "
        "only, so that a pod maps to one tier at most; and no two tiers may read the same "
        "resource."
    ),
}


@dataclass
class Key:
    path: str
    type: str
    default: str
    constraints: list[str]
    allowed: list[str]
    description: str
    rules: list[str] = field(default_factory=list)


class DocError(Exception):
    """The models hold something this script cannot document."""


# -- reading the models --------------------------------------------------------------------


@dataclass
class TypeInfo:
    text: str
    constraints: list[str]
    allowed: list[str]
    model: type[BaseModel] | None = None
    is_list: bool = False


def _constraint(item: object) -> str | None:
    """One metadata entry in words; None for entries that need no words."""
    if isinstance(item, StringConstraints):
        meanings = config_module._PATTERN_MEANINGS
        if str(item.pattern) not in meanings:
            raise DocError(f"no words for the pattern {item.pattern!r}")
        others = {
            name: value
            for name, value in vars(item).items()
            if name != "pattern" and value is not None
        }
        if others:
            raise DocError(f"no words for string constraints {others}")
        return meanings[str(item.pattern)]
    if isinstance(item, annotated_types.MinLen):
        n = item.min_length
        return f"at least {n} item" + ("s" if n != 1 else "")
    if isinstance(item, annotated_types.Gt):
        return f"greater than {item.gt}"
    if isinstance(item, annotated_types.Ge):
        return f"at least {item.ge:g}"
    if isinstance(item, annotated_types.Le):
        return f"at most {item.le:g}"
    if isinstance(item, AllowInfNan):
        return None if item.allow_inf_nan else "finite (no `.inf` or `.nan`)"
    if isinstance(item, Strict):
        return None  # said by the type: a YAML boolean or number, never a string
    if isinstance(item, AfterValidator):
        if item.func is config_module._unique:
            return "no item listed twice"
        raise DocError(f"no words for the validator {item.func.__name__}")
    if isinstance(item, FieldInfo):
        raise DocError("a FieldInfo should have been unpacked")
    raise DocError(f"no words for the constraint {item!r}")


def _metadata(items: list[Any]) -> list[Any]:
    """Flatten FieldInfo objects found in Annotated[...] into their own metadata."""
    flat: list[Any] = []
    for item in items:
        if isinstance(item, FieldInfo):
            flat.extend(item.metadata)
        else:
            flat.append(item)
    return flat


def _type_info(annotation: Any, metadata: list[Any]) -> TypeInfo:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return _type_info(base, _metadata(list(extra)) + metadata)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(arms) != 1 or len(typing.get_args(annotation)) != 2:
            raise DocError(f"no words for the union {annotation!r}")
        inner = _type_info(arms[0], metadata)
        inner.text += " or `null`"
        return inner
    constraints = [c for c in (_constraint(m) for m in metadata) if c]
    if origin is tuple:
        args = typing.get_args(annotation)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise DocError(f"no words for the tuple {annotation!r}")
        item = _type_info(args[0], [])
        text = "list of " + (item.text + "s" if item.model is None else "mappings")
        item_rules = [f"each item: {c}" for c in item.constraints]
        return TypeInfo(text, constraints + item_rules, item.allowed, item.model, True)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return TypeInfo("string", constraints, [f"`{m.value}`" for m in annotation])
    if origin is typing.Literal:
        return TypeInfo("string", constraints, [f"`{v}`" for v in typing.get_args(annotation)])
    if annotation is bool:
        return TypeInfo("boolean", constraints, ["`true`", "`false`"])
    if annotation is float:
        return TypeInfo("number", constraints, [])
    if annotation is str:
        return TypeInfo("string", constraints, [])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return TypeInfo("mapping", constraints, [], annotation)
    raise DocError(f"no words for the type {annotation!r}")


def _default_text(info: FieldInfo, type_info: TypeInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default
    if value is PydanticUndefined:
        raise DocError("a default factory has no words here")
    if type_info.model is not None:
        if type_info.is_list:
            names = ", ".join(f"`{getattr(v, 'name', '?')}`" for v in value)
            return f"{names} (see [the defaults](#the-default-configuration))"
        return "the defaults of the keys below"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    return f"`{value}`"


def _validator_rules(model: type[BaseModel]) -> tuple[dict[str, list[str]], list[str]]:
    """Words for the model's validators: per field (by name), and for the model as a whole."""
    decorators = model.__pydantic_decorators__
    per_field: dict[str, list[str]] = {}
    whole: list[str] = []
    for name, decorator in decorators.field_validators.items():
        words = VALIDATORS.get((model.__name__, name))
        if words is None:
            raise DocError(f"{model.__name__}.{name}: describe this validator in VALIDATORS")
        for field_name in decorator.info.fields:
            per_field.setdefault(field_name, []).append(words)
    for name in decorators.model_validators:
        words = VALIDATORS.get((model.__name__, name))
        if words is None:
            raise DocError(f"{model.__name__}.{name}: describe this validator in VALIDATORS")
        whole.append(words)
    if decorators.root_validators or decorators.validators or decorators.field_serializers:
        raise DocError(f"{model.__name__}: a kind of decorator this script does not know")
    return per_field, whole


def walk(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    per_field, _ = _validator_rules(model)
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}" if prefix else (info.alias or name)
        if not info.description:
            raise DocError(f"{model.__name__}.{name} ({path}) has no description")
        type_info = _type_info(info.annotation, list(info.metadata))
        rules = list(per_field.get(name, []))
        if type_info.model is not None:
            rules += _validator_rules(type_info.model)[1]
        yield Key(
            path=path,
            type=type_info.text,
            default=_default_text(info, type_info),
            constraints=type_info.constraints,
            allowed=type_info.allowed,
            description=" ".join(info.description.split()),
            rules=rules,
        )
        if type_info.model is not None:
            yield from walk(type_info.model, path + ("[]" if type_info.is_list else ""))


# -- writing the page ----------------------------------------------------------------------

HEADER = f"""\
<!-- Generated by scripts/gen-config-docs.py from the models in nri_midbatch/config/model.py.
     Do not edit: change the field descriptions there (or the prose in the script), then run
     {COMMAND}
     `--check` exits 1 while this file is stale; tests/unit/test_docs.py runs it. -->

# Configuration

nri-midbatch reads one YAML document. Keys are camelCase, every key is optional (an empty
file gives the built-in defaults, which reproduce Koordinator's koordlet), and anything
unexpected is an error rather than a silent default: an unknown key, a key written twice in
one mapping, a value of the wrong type (`"true"` is a string, not a boolean), a misspelt
enumeration value (`ignore` is not `Ignore`).

Errors name the source and the path of the field at fault, for example
`/etc/nri-midbatch/config.yaml: tiers.0.name: must match [a-z0-9-]+` (YAML syntax errors
give the line and column instead).

- [How the configuration is loaded](#how-the-configuration-is-loaded)
- [What a configuration may be](#what-a-configuration-may-be)
- [What the values follow](#what-the-values-follow)
- [What a reload does to running workloads](#what-a-reload-does-to-running-workloads)
- [Checking a file](#checking-a-file)
- [Reference](#reference)
- [The default configuration](#the-default-configuration)
"""

LOADING = """\
## How the configuration is loaded

**At start-up.** `nri-midbatch run --config FILE` reads FILE; without `--config` the built-in
defaults apply. A file that cannot be read or is invalid stops the command with exit status
2 and the reason on stderr; the plugin never starts on a configuration it could not
validate.

**Pre-launched plugins: the runtime's drop-in.** A plugin the runtime starts itself gets no
arguments, so no `--config`. Its configuration is the runtime's drop-in file,
`/etc/nri/conf.d/NN-name.conf` (or `name.conf`, e.g. `/etc/nri/conf.d/10-midbatch.conf`),
which the runtime sends verbatim in `Configure` each time the plugin registers. When that
text is not blank it **replaces the whole configuration** the plugin started with: it is not
merged, so a key the drop-in leaves out takes its built-in default, not the value from a
`--config` file. An invalid drop-in is refused: the configuration in force stays, the error
is logged (`configuration from the runtime rejected`, with the field path) and counted in
`nri_midbatch_config_reloads_total{result="rejected_from_runtime"}`, and registration goes
on. External plugins (a DaemonSet, a systemd service) always get an empty text, so for them
`Configure` changes nothing. The runtime reads the drop-in only when it starts the plugin,
so a changed drop-in takes effect when the runtime restarts.

**Reloading.** With `--config`, the plugin looks at the file once a second (inode, size
and modification time, so the symlink swap of a Kubernetes ConfigMap update is seen). A
change is reloaded once the file has held still for one more look, so an editor that
truncates and then writes is never read half-way; `SIGHUP` reloads at once. Each reload
is counted in `nri_midbatch_config_reloads_total` by `result`:

- `applied`: the file was valid and differed from the configuration in force; it now
  applies.
- `unchanged`: the file was valid and equal to the configuration in force.
- `invalid`: the file could not be read or was invalid. The previous configuration stays
  in force, and the error is logged with the field path (`configuration rejected, the
  previous one stays in force`).
- `rejected_from_runtime`: a pre-launched plugin's drop-in was refused at `Configure`
  (above).
- `failed`: the reload met an error of the plugin's own (a bug); it is logged with its
  traceback (`configuration reload failed`). Watching goes on either way.

A file that disappears, or is replaced by a directory, is a change too: once it has held
still for one more look it is refused as `invalid` (`cannot read`), and the previous
configuration stays until a valid file is back. Without `--config` (a pre-launched plugin,
or the built-in defaults) there is nothing to reload: `SIGHUP` only logs a warning.

**In a child process.** `run` validates every configuration (at start-up, on a reload, a
drop-in at `Configure`) in a short-lived child, `python -P -m nri_midbatch.config.validator`,
with the same interpreter and package as the plugin: it does what `check-config` does and
hands back the result, or the error with the same message. The plugin itself never loads
pydantic, the validating library, which would otherwise stay in its memory for good
(10 MB; [performance](performance.md#memory-round-4)). A child takes about 0.3 s of CPU; at
start-up it runs while the plugin loads, a reload waits for it in a thread.

A slow child never costs a valid configuration, nor the plugin's start: on a busy node a
child can wait long for a core. The child's bound is CPU time, which load does not
stretch: a child that spends 10 s of CPU on the configuration once Python and pydantic are
loaded (far more than any configuration costs; starting alone takes seconds of CPU on an
emulated node) is killed and the configuration refused as `invalid` (`cannot be validated:
used more than 10 s of CPU`). A child that has not answered after 30 s of wall time,
cannot start (no memory or processes left) or dies without a verdict is not a verdict: the
plugin logs a warning
(`validator gave no answer in time; validating in-process`, or `could not start`, `gave no
verdict`) and validates the configuration itself, with the same bounds and the same
answer. That costs the 10 MB of pydantic for the rest of the process's life, far less than
a plugin that refuses its configuration and exits into a crash loop while no pod is
corrected. The bounds below keep that validation to about a second of CPU.
"""

BOUNDS = f"""\
## What a configuration may be

The same bounds hold for the file (at start-up, at each reload, for `check-config`) and for
a drop-in's text at `Configure`. Anything beyond them is refused with a reason like any
invalid configuration, without reading or parsing further:

- **A regular file**, once symlinks are followed. A FIFO, a socket, a device (a link to
  `/dev/zero`) or a directory is refused without being read; the file is opened without
  blocking.
- **At most {config_module.MAX_CONFIG_BYTES:,} bytes** (1 MiB, a ConfigMap's own limit),
  as UTF-8.
- **Nested at most {bounded_yaml.MAX_DEPTH} levels deep** (the settings themselves go 4
  deep).
- **At most {bounded_yaml.MAX_NODES:,} values once YAML aliases are expanded**, and no
  alias inside the node it refers to: anchors and aliases may share a list between tiers,
  but a few lines that alias each other into billions of values (an "alias bomb") are
  refused while they are still a few lines, and a long list as soon as its
  {bounded_yaml.MAX_NODES + 1:,}th value is read. Within these bounds a configuration
  costs at most about a second of CPU to read.
- Values YAML itself cannot read, such as an integer of more than 4,300 digits, make the
  file invalid like any other error.

### Numbers

A number (today only `rules.cpuNormalizationRatio`) is written as a decimal:
{bounded_yaml.DECIMAL_SYNTAX}. That is the one grammar, for plain values and for explicit
`!!float` / `!!int` tags alike. YAML 1.1, which the configuration is otherwise read as,
also takes `0x10`, `0o17`, `1_000` and `1:30` (base 60) for numbers, `010` for octal
eight, and reads `1e300` (an exponent without a dot) as text; here `010` is ten, `1e300`
is a number, and the others are refused (`must be a decimal number ...`), as are `.inf`,
`.nan` and a quoted number (`'1.2'`). A plain value that looks like a decimal is a number,
so quote a name that does.

The value used is exactly the decimal written: `1.15` is 23/20, not the double nearest to
it. A decimal that no double holds exactly is refused (`valid YAML, but a number is refused:
... cannot be held exactly as a double`) rather than rounded: one with more significant
digits than a double keeps (`1.23456789012345678`), or beyond a double's range (`1e999`,
`1e-999`). Up to 15 significant digits between 1e-308 and 1e308 are always held.
"""

RELOAD = """\
## What the values follow

**The invariant.** After any history, within `convergence.intervalSeconds` (default 10 s)
plus twice a convergence pass's duration of the last write by anyone, for every pod and
container the plugin has touched, the values in force are what a fresh plugin with the
configuration in force would set from kubelet's own values, whatever happened before:
reloads, bursts of reloads, restarts of the plugin or of the runtime, resizes, and writes of
the cgroup files by anyone else. The plugin's own events (`RunPodSandbox`, `CreateContainer`,
`UpdateContainer`, `Synchronize`, a reload) set the values at once; the convergence pass is
what makes them hold whoever writes after. Each field a tier claims holds the tier's value,
never looser than kubelet's (the CFS quota and the memory limit); each field the plugin set
before and no tier claims any more (normalization turned off, a tier removed, `mode: observe`,
`cgroups.podLevel: false`) holds kubelet's value again, and is then no longer the plugin's. A
field the plugin never set is never touched: it may be another plugin's.

**Kubelet's values (the baseline)** come from:

- **A container**: its resources at `CreateContainer`, and the resources kubelet asks for
  at `UpdateContainer` (a resize). Kept by the annotation `nri-midbatch.io/native-limits`
  (CPU shares, quota, period, memory limit), which the runtime keeps with the container;
  after a resize, by the pod's record.
- **A container running before the plugin first saw it**: what it holds at that
  `Synchronize` (nothing of it was the plugin's). Kept by the pod's record once the plugin
  sets a value on it, as is any container whose values a reload wrote to its files.
- **A BestEffort pod**: kubelet's fixed values, 2 shares, no quota, no memory limit.
- **Any other pod**: its cgroup files at `RunPodSandbox`, before the plugin writes them
  (they include the pod overhead); at a `Synchronize` with no record, the pod resources plus
  overhead the runtime sends (containerd 2.x), or on a runtime that sends none (containerd
  1.7) its cgroup files. Kept by the pod's record.
- **A pod after a resize**: moved by its container's change (kubelet's pod limit is the sum
  of its containers' plus the overhead); a pod that gains a limit it did not have, or whose
  baseline the plugin never read (no tier claimed it at its `RunPodSandbox`), is read back
  from its cgroup after the reply, once kubelet has written it; on NRI v0.10+ the new pod
  resources of `UpdatePodSandbox`. Kept by the pod's record.
- **A pod in a new sandbox**: a pod is its uid, not its sandbox. Kubelet runs a new sandbox
  for a pod whose sandbox died (a dead pause container, a node restart) with the same uid
  and in the same pod cgroup, which still holds the plugin's values, and removes the old
  sandbox before or after. The new sandbox takes the pod's baseline, and what the plugin
  set there, from the older sandbox the plugin knows, else from the pod's record; the pod
  resources the runtime sends (containerd 2.x) win for the baseline. Its cgroup is never
  read as kubelet's then. Removing the old sandbox keeps the record, and a value the
  plugin set under the old sandbox is given back as under it.
- **A pod the plugin forgot** to stay within its bound on the pods it remembers (10,000;
  [troubleshooting.md](troubleshooting.md#what-pods-and-files-can-make-the-plugin-hold)):
  its record stays, with the pod's baseline, what the plugin set on the pod, and its
  containers' baselines and values the annotation does not tell. While the pod is
  forgotten, nothing reaches it: not a reload, not the convergence pass, so a value someone
  else writes there stays. The runtime shows it again at its next event (a new sandbox of
  its uid, `CreateContainer`, `UpdateContainer`, `UpdatePodSandbox`) or the next
  `Synchronize`: the pod is then restored from its record and gets its values under the
  configuration in force at once; each container as the runtime shows it (the one of the
  event, all of them at the next `Synchronize`), and the record keeps those not shown yet.
  A resize then moves the pod's baseline as for any pod, and from then on the pod
  converges as any other. A value the plugin came to claim while the pod was forgotten it
  never set, so it does not take that value back from whoever wrote it.

A pod's record is a small file, `<pod uid>.json`, in `nri-midbatch run --state-dir` (default
`/var/lib/nri-midbatch/pods`, a host path in the DaemonSet), at most 640 KiB and 2,500
containers each (a pod of 2,000 containers, each resized, takes about 460 KB), kept by the
pod's uid: written when what it keeps changes, and kept while the plugin knows a sandbox of
the pod. When the pod's last sandbox is removed, its record goes with it if the pod's cgroup
is gone; while the cgroup stays (kubelet may run a new sandbox in it, or has not removed it
yet) the record is kept, for at most 256 such pods, the oldest removed first. After each
`Synchronize` the records of pods the runtime did not list, but those 256, are removed, 16
files of the directory at a time between requests. The plugin writes a record to a fresh
name, created so that it cannot be a link, and renames it over the pod's file; it opens every
file relative to the directory, which must not itself be a link. A record is read only within
[bounds](troubleshooting.md#what-pods-and-files-can-make-the-plugin-hold): one that is not a
record (not JSON, nested deeper than the format, another shape), holds a value no cgroup file
takes or kubelet never writes (a quota of -5 or below 1 ms, a memory limit of `1e30`, shares
outside [2, 262144]), or lies past the 4 MiB one `Synchronize` reads is refused: logged with
the pod uid (`pod record refused`, the first of each reason at warning), counted in
`nri_midbatch_baseline_records_refused_total`, and the pod is taken as if it had no record.
Failure cases, each counted in `nri_midbatch_baseline_record_failures_total` where a file
could not be read, written or removed:

- **Records lost** (the directory wiped, or the plugin run without it): after a restart the
  plugin takes a non-BestEffort pod's cgroup files, which hold its own earlier values, for
  kubelet's on containerd 1.7, and a container that it updated at a `Synchronize` without an
  annotation keeps its updated values as kubelet's: values can then stay as tight as an
  earlier configuration made them (never looser than kubelet's), until the pod is recreated.
- **Containers annotated by an earlier version** carry no CPU shares: their shares are not
  given back. Containers an earlier version updated at a `Synchronize` (no annotation, no
  record) hold its values, which the upgraded plugin takes for kubelet's.
- **Without `--state-dir`** a container without the annotation is never scaled by
  cpu-normalization at a `Synchronize`, as what it holds may be an earlier plugin's.
- **Init containers** are not kept: kubelet's pod cgroup already holds their share of the
  pod's values at `RunPodSandbox`, and a resize moves the pod by the resized container only.
- **A pod that becomes limited by a resize** (every container limited, where one was not;
  a container not created yet may still leave it unlimited), or whose baseline the plugin
  never read, is read back from its cgroup after the `UpdateContainer` reply. A value the
  resize moves that the cgroup still holds as at the `UpdateContainer`, a limit still
  unlimited there, and a value the plugin set itself are not taken as kubelet's (kubelet
  writes the pod after the containers, or leaves it): read again at the pod's re-checks
  (0.3 s and 2 s later). At the last one the plugin takes what the cgroup holds, but where
  it holds the plugin's own value: a limit kubelet had left unlimited then stays unlimited,
  other values are the container's change added to the pod's. Of such a pod, a resize
  kubelet writes first (its order for an increase) is known only at the last re-check.
- **A resized pod on cgroup v2 under containerd 1.7**: the pod's shares are known only from
  its `cpu.weight`, which a range of about 26 shares gives; the plugin takes the fewest, and
  a resize moves them by the container's change. The weight it gives back can then be one
  below kubelet's (never above: never looser). Containerd 2.x tells the pod's resources and
  its resizes (`UpdatePodSandbox`): exact.
- **A pod between two sandboxes across a restart**: the old sandbox removed, the plugin
  restarted, and only then a new sandbox run: the restarted plugin does not know the pod
  had no sandbox for a while, its first `Synchronize` removes the record, and on
  containerd 1.7 the new sandbox's cgroup is read as kubelet's (kubelet removes an old
  sandbox only once a new one runs; removed first, it is someone's `crictl rmp`).

**On each transition**: a reload plans every workload against what the plugin last put in
force there, not against the previous configuration, so a pass that failed halfway is
completed by the next one. Reloads run one at a time, each to its end: requests that come
while one runs (SIGHUPs, file changes) are served by one pass after it, which reads the file
then, so the last file wins. A restart or a runtime's `Synchronize` brings every workload to
the same values from the baseline. A resize (`UpdateContainer`, `UpdatePodSandbox`)
recomputes the container and its pod.

### Convergence: whoever wrote last

Kubelet writes a pod's cgroup on every resize: after the containers when the resize lowers
them, which is after the plugin's own pod write, and (from kubernetes#137555) right after
`UpdatePodSandbox` in either direction. Anyone else (an operator, an agent, another plugin,
systemd) may write any file at any time. So the plugin keeps the values in force as a state,
and brings the files back to it:

- **One pass, four triggers**: the same check (each cgroup's files read, compared, and
  written back where they differ; pods before their containers) runs after a resize, on its
  period, after a reload and after a `Synchronize`. What differs is what it is compared
  with and who writes: a reload first brings workloads to the new configuration (the
  runtime's `UpdateContainers` where safe, else the files), then checks every one (with
  `intervalSeconds` above 0), so a `SIGHUP` with the file unchanged also puts back what
  someone else wrote; a `Synchronize` answers container updates in its reply and checks,
  after it, the containers the runtime reports at their values against those values
  (counted in `nri_midbatch_container_repairs_total`), a container whose pod's quota holds
  it back (cgroup v1) once more after the pods.
- **Shortly after a resize**: a pod whose container was resized, or that got an
  `UpdatePodSandbox`, is checked again 0.3 s and 2 s later: kubelet's write after the
  plugin's lasts that long, not until the next event.
- **Every `convergence.intervalSeconds`** (default 10 s, about koordlet's period; `0`: off),
  one pass over every pod and container the plugin has values in force on: each one's
  cgroup files are read and compared with its target (the tier's values, kubelet's for
  what is given back), and what differs is written back. Pods come before their
  containers, and a pod whose write failed is tried once more after them (cgroup v1 keeps
  a pod's quota at or above its children's). On cgroup v2 a pod's `cpu.weight` is compared
  with the plugin's conversion of its shares (kubelet's linear one); a container's, which
  the runtime converted, with either conversion runtimes use (the linear one of runc up to
  1.2, and the curve of runc 1.3 and crun, which maps 1024 shares onto 100): a weight that
  is neither is drift, put back with the linear one. Under the systemd driver the repaired values
  are also set again as unit properties; the properties themselves are not read (setting
  them makes systemd write the files, where the pass sees any change).
- **What counts as kubelet's write**: a value that is kubelet's known value for that pod
  or container (its baseline). It is put back like any other (the tier's value is the
  target), and counted with `writer="kubelet"`. Any other value is counted with
  `writer="unknown"` (`nri_midbatch_drift_found_total`,
  `nri_midbatch_drift_repaired_total`; `nri-midbatch status` shows each pod's last check
  and last drift). **Kubelet's baseline moves only with the events that tell it**:
  `UpdateContainer` (kubelet's formula over the containers on containerd 1.7) and
  `UpdatePodSandbox` (containerd 2.x), never from what a file holds. Kubelet's
  `UpdatePodSandbox` carries the resized resource at its new value and fills the others
  from the pod cgroup as it finds it (kubelet's `doPodResizeAction`: `GetPodCgroupConfig`,
  then the merge), which may hold the plugin's own value: a field told at the value the
  plugin applied there, and not at the known one, keeps the known one. `UpdatePodSandbox`
  is never answered with an error (which would block kubelet's resize) unless
  `failurePolicy: Fail`.
- **Left alone**: a field the plugin never set (it may be another plugin's); a workload
  with a change still planned (a reload or a `Synchronize` not yet through: that change
  writes it); a pod whose kubelet values are not known for sure; a workload whose decision
  fails (bad input). In `mode: observe` nothing is the plugin's, so nothing is checked.
- **What it costs**: each workload's three files read once per pass, and written only where
  they differ. The work is done in pieces left for after replies: up to 16 workloads or
  0.5 ms a piece, so a request waits for at most one piece (about 0.5 ms, more where a
  piece puts values back). Each cgroup's path is resolved and checked once and kept while
  the workload is known and the configuration stays (a reload locates every cgroup again);
  each read still opens every file afresh, without following a link. At 1,000 pods and
  10,000 containers: 29,700 files and 0.4-0.6 s of CPU a pass on the 2-core development VM,
  2-3 s for the first pass after a start or a reload (`make bench`,
  [performance.md](performance.md#convergence)): 4-6% of a core at the default period.

## What a reload does to running workloads

New pods and containers follow a new configuration from the moment it applies. For those
already running, the plugin keeps the pods and containers the runtime told it about (at
`Synchronize`, `RunPodSandbox` and `CreateContainer`; forgotten at `RemoveContainer` and
`RemovePodSandbox`, and a pod's older sandbox when a new one of its uid runs), with their
baselines ([What the values follow](#what-the-values-follow)).
For each one it computes the values in force under the new configuration, and changes only
those that differ from what it last put in force.

- **Containers, on a runtime with NRI v0.12.2 or later** (the version the runtime reports
  at `Configure`; a runtime that reports none is looked up by its own version): the plugin
  asks the runtime to apply the new values with `UpdateContainers`, from a task of its own.
  Containers the runtime reports it could not update get their cgroup files written
  instead (logged for each, with its pod and container: `runtime could not update the
  container, writing its cgroup files`); if the call itself fails, or gets no answer
  within 10 seconds, everything goes through the cgroup files (logged: `UpdateContainers
  failed, writing cgroup files`, and counted in
  `nri_midbatch_reload_writes_total{path="update_containers",result="failed"}`).
- **Containers, on older runtimes** (any containerd or CRI-O release on an NRI older than
  v0.12.2): their `UpdateContainers` can deadlock the runtime, so the plugin writes the
  containers' cgroup files itself: `cpu.shares`, `cpu.cfs_quota_us`,
  `memory.limit_in_bytes` on cgroup v1; `cpu.weight`, the quota of `cpu.max`, `memory.max`
  on v2. On v2 the shares become a weight by kubelet's formula, which is not always the one
  the runtime used when it created the container.
- **Pods**: the pod cgroup files, as at `RunPodSandbox`. A pod goes up before its
  containers and down after them: first the pods whose containers' quota rises (on cgroup
  v1 a child's quota above its pod's is refused), then the containers (written, or
  `UpdateContainers` answered), then the other pods and any first write that failed
  ([troubleshooting.md](troubleshooting.md#order-of-lowering)).
  With `cgroups.podLevel: false` pod files the plugin set go back to kubelet's values, and
  are left alone from then on.
- **Workloads that leave every tier**, and fields no tier claims any more, get kubelet's
  values back. A workload whose decision fails under the new configuration (bad input) is
  not touched: it keeps what it has.
- **Into `mode: observe`**: everything the plugin set goes back to kubelet's values, and
  nothing more is set until enforce mode returns.

Each write is logged (`cgroup set for new configuration` or `cgroup not set for new
configuration` with the reason); `configuration reloaded` gives the number of containers
and pods planned.
"""

CHECKING = """\
## Checking a file

```sh
nri-midbatch check-config /etc/nri-midbatch/config.yaml
```

Exit status 0: the file is valid, and the configuration it gives, with every default filled
in, is printed as YAML (the same YAML is accepted back). Exit status 1: the reason is on
stderr, e.g. `nri-midbatch: config.yaml: rules.cpuNormalizationRatio: Input should be
greater than 0`. It runs the same validation as `run` and the reloads.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    keys = list(walk(Config))
    out = [HEADER, LOADING, BOUNDS, RELOAD, CHECKING, "## Reference\n"]
    out.append(
        "Paths use `[]` for the items of a list: `tiers[].name` is the `name` of each tier.\n"
    )
    out.append("| key | type | default |\n|---|---|---|")
    for key in keys:
        anchor = _anchor(key.path)
        out.append(f"| [`{key.path}`](#{anchor}) | {_cell(key.type)} | {_cell(key.default)} |")
    out.append("")
    for key in keys:
        out.append(f"### `{key.path}`\n")
        facts = [f"**Type:** {key.type}", f"**Default:** {key.default}"]
        if key.allowed:
            facts.append("**Values:** " + ", ".join(key.allowed))
        if key.constraints:
            facts.append("**Constraints:** " + "; ".join(key.constraints))
        out.append("- " + "\n- ".join(facts) + "\n")
        out.append(key.description + "\n")
        for rule in key.rules:
            out.append(f"Checked across keys: {rule}\n")
    out.append("## The default configuration\n")
    out.append(
        "What an empty file gives, as `nri-midbatch check-config` prints it. "
        "[`examples/config/default.yaml`](../examples/config/default.yaml) is the same "
        "configuration with comments.\n"
    )
    out.append("```yaml\n" + effective_config_yaml(Config()) + "```\n")
    return "\n".join(out)


def _anchor(path: str) -> str:
    """GitHub's heading anchor for a heading that is just `path` in backticks."""
    return "".join(ch for ch in path.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/configuration.md is stale"
    )
    args = parser.parse_args(argv)
    try:
        text = render()
    except DocError as exc:
        print(f"gen-config-docs: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=str(OUTPUT.relative_to(ROOT)),
                tofile="generated",
            )
            sys.stderr.writelines(diff)
            print(
                f"gen-config-docs: {OUTPUT.relative_to(ROOT)} is stale; run {COMMAND}",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
