"""An oracle for issue 23 (history independence), written apart from the plugin.

It shares no code with `nri_midbatch`, not even a constant or the quantity parser:
Koordinator's formulas are written again here, from Koordinator's batchresource and
cpunormalization hooks and docs/koordinator.md, for the few quantities the tests generate.
"""
