"""The compiled policy: everything derivable from the configuration, computed once."""

from __future__ import annotations

from collections.abc import Sequence

from .calculate import Rules
from .chain import Chain
from .classify import ClassificationSettings, Classifier
from .tiers import Tier


class Policy:
    __slots__ = ("chain", "classifier", "rules", "spec_annotation")

    def __init__(
        self, tiers: Sequence[Tier], classification: ClassificationSettings, rules: Rules
    ) -> None:
        self.chain = Chain(tiers)
        self.classifier = Classifier(classification, self.chain.tiers)
        self.rules = rules
        self.spec_annotation = classification.spec_annotation
