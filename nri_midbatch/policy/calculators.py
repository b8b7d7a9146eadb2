"""The calculators a tier may name (`tiers[].calculator`), each one module of policy/.

A calculator gets the pod (and container), its tier, the rules and the parsed spec; it returns
the values to set, None to leave the workload alone, or the spec's error. It appends one trace
step per value it sets, or the step that says why it sets none. The chain, the decision and
the plugin handlers are the same for every calculator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from . import extended, normalize
from .calculate import CgroupValues
from .inputs import Inputs
from .spec import SpecError
from .trace import Step

Calculator = Callable[[Inputs, list[Step]], CgroupValues | SpecError | None]

CALCULATORS: Mapping[str, Calculator] = {
    extended.NAME: extended.extended_values,
    normalize.NAME: normalize.normalized_values,
}

#: Calculators that read the tier's extended resources (the others have none).
READS_RESOURCES = frozenset({extended.NAME})
