"""The pure policy core: views in, decisions out. Imports nothing but the standard library."""

from .calculate import CgroupValues, Rules
from .classes import PriorityClass, QoSClass
from .classify import ClassificationSettings, Classified, Source
from .compiled import Policy
from .decision import (
    Decision,
    ErrorKind,
    PodClass,
    TraceStep,
    classify_pod,
    decide_container,
    decide_pod,
)
from .tiers import Tier
from .trace import render
from .views import ContainerView, NativeLimits, PodView

__all__ = [
    "CgroupValues",
    "ClassificationSettings",
    "Classified",
    "ContainerView",
    "Decision",
    "ErrorKind",
    "NativeLimits",
    "PodClass",
    "PodView",
    "Policy",
    "PriorityClass",
    "QoSClass",
    "Rules",
    "Source",
    "Tier",
    "TraceStep",
    "classify_pod",
    "decide_container",
    "decide_pod",
    "render",
]
