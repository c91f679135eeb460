import pytest

from dsv4opt.errors import DsvOptError
from dsv4opt.workload.config import CSA, HCA, WINDOW, ModelConfig


def test_flash_layer_pattern_follows_the_public_config():
    cfg = ModelConfig.from_name("dsv4-flash")
    kinds = [cfg.layer_kind(i) for i in range(cfg.layers)]
    assert kinds[:4] == [WINDOW, WINDOW, CSA, HCA]
    assert kinds.count(CSA) == 21 and kinds.count(HCA) == 20 and len(kinds) == 43
    assert cfg.hc_mix == 24
    assert cfg.experts_resident_default == 32


def test_with_layers_cuts_and_checks_range():
    cfg = ModelConfig.from_name("dsv4-flash")
    assert cfg.with_layers(4).layers == 4
    assert cfg.with_layers(None) is cfg
    with pytest.raises(DsvOptError, match="--layers"):
        cfg.with_layers(44)


def test_unknown_config_names_the_known_ones():
    with pytest.raises(DsvOptError, match="dsv4-tiny"):
        ModelConfig.from_name("dsv4-huge")
