"""The demo run (diloco.demo): 4 islands in 2 regions, a valid config of any budget."""

from diloco.demo import DEMO, demo_config


def test_the_demo_is_four_islands_in_two_regions_of_the_budget_given():
    config = demo_config(5000)

    assert [island.name for island in config.islands] == [i["name"] for i in DEMO["islands"]]
    assert sorted({island.region for island in config.islands}) == ["us-east", "us-west"]
    assert config.budget.total_tokens == 5000


def test_the_demo_trains_its_own_model_shape():
    config = demo_config(DEMO["budget"]["total_tokens"])

    assert (config.model.n_layer, config.model.n_embd) == (2, 64)
    assert config.sync.min_quorum == 2
