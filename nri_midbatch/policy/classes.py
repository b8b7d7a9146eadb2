"""Koordinator's QoS and priority class names (apis/extension qos.go, priority.go)."""

from __future__ import annotations

from enum import StrEnum


class QoSClass(StrEnum):
    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"


class PriorityClass(StrEnum):
    PROD = "koord-prod"
    MID = "koord-mid"
    BATCH = "koord-batch"
    FREE = "koord-free"
