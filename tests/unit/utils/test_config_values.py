"""lit_ppo.utils.config_values: plain values, and a config node read and set alike as a mapping or a namespace."""

from types import SimpleNamespace

from lit_ppo.utils.config_values import config_mapping, config_value, is_plain, set_config_value


def test_plain_values_are_scalars_in_lists_and_string_keyed_mappings():
    assert is_plain({"a": [1, 2.5, "x", None, True], "b": {"c": (1, 2)}})
    assert not is_plain({"a": [1, print]})
    assert not is_plain({1: "integer key"})
    assert not is_plain(b"bytes") and is_plain([b"bytes"], (bytes,))


def test_a_node_is_read_and_set_alike_as_a_mapping_or_a_namespace():
    as_dict, as_namespace = {"run_id": None}, SimpleNamespace(run_id=None)
    for node in (as_dict, as_namespace):
        assert config_value(node, "run_id") is None and config_value(node, "absent") is None
        set_config_value(node, "run_id", "abc")
        assert config_value(node, "run_id") == "abc" and config_mapping(node) == {"run_id": "abc"}
    assert config_value(None, "run_id") is None and config_mapping(None) == {}
    copied = config_mapping(as_dict)
    copied["run_id"] = "other"
    assert as_dict["run_id"] == "abc"
