"""bounded_yaml: the bounds shared by the configuration and explain's pod files.

The hostile texts themselves are tried through the configuration (test_config.py) and
through explain (test_explain.py); here, the edges of the node bound and JSON.
"""

from __future__ import annotations

import pytest

from nri_midbatch.config.bounded_yaml import MAX_NODES, UntrustedInputError, load_yaml


def flow_list(items: int) -> str:
    return "[" + ", ".join(["1"] * items) + "]\n"


def test_a_list_at_the_node_bound_loads() -> None:
    assert load_yaml(flow_list(MAX_NODES - 1), "list.yaml") == [1] * (MAX_NODES - 1)


def test_a_long_list_is_refused_while_it_is_composed_not_after() -> None:
    # Refused as the nodes are composed ("once its aliases are expanded" would mean after
    # all 300,000 were built, seconds of CPU on a busy node).
    with pytest.raises(UntrustedInputError) as caught:
        load_yaml(flow_list(300_000), "list.yaml")
    message = str(caught.value)
    assert message.startswith("list.yaml: not valid YAML: ")
    assert f"stands for more than {MAX_NODES} values" in message
    assert "once its aliases are expanded" not in message


def test_json_reads_as_yaml() -> None:
    text = '{"metadata": {"name": "p", "annotations": {"a": "{\\"x\\": 1}"}}, "n": [1, 2.5]}'
    assert load_yaml(text, "pod.json") == {
        "metadata": {"name": "p", "annotations": {"a": '{"x": 1}'}},
        "n": [1, 2.5],
    }
