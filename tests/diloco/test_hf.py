import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diloco.cluster import run_local
from diloco.config_parse import ConfigError
from diloco.data import load_corpus
from diloco.evaluation import Evaluator
from diloco.fragments import partition, run_fragments
from diloco.hf import CausalLM, export, model_config
from diloco.island import initial_model
from diloco.sizes import estimate
from syncd.environment import data_dir

# A Llama of 2 layers, 64 wide: the shape the tests of hf runs train.
TINY_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64}
TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2,
             "n_head": 2, "n_positions": 64, "tie_word_embeddings": True}


def hf_model(config: dict) -> dict:
    return {"source": "hf", "hf_config": json.dumps(config), "block_size": 16}


def test_every_build_from_the_seed_has_the_same_weights(make_config):
    config = make_config(model=hf_model(TINY_LLAMA))

    a, b = initial_model(config).state_dict(), initial_model(config).state_dict()

    assert a.keys() == b.keys()
    assert all(torch.equal(a[n], b[n]) for n in a)
    other = initial_model(replace(config, seed=1)).state_dict()
    assert not torch.equal(a["lm.lm_head.weight"], other["lm.lm_head.weight"])


def test_the_sizes_that_size_a_run_are_the_built_models_tensors(make_config):
    config = make_config(model=hf_model(TINY_LLAMA), sync={"fragments": 3})
    model = initial_model(config)
    built = {n: t.numel() for n, t in model.state_dict().items()}

    fragments = run_fragments(config)

    names = [n for f in fragments for n in f.tensor_names]
    assert sorted(names) == sorted(built)  # each tensor in exactly one fragment
    assert sum(f.numel for f in fragments) == model.num_params()
    assert estimate(config).params == model.num_params()
    assert "lm.model.layers" in " ".join(f.name for f in fragments)


def test_a_tied_weight_is_one_tensor_in_one_fragment(make_config):
    config = make_config(model=hf_model(TINY_GPT2))
    model = initial_model(config)
    state = model.state_dict()

    assert model.lm.lm_head.weight is model.lm.transformer.wte.weight
    assert "lm.lm_head.weight" not in state
    fragments = partition({n: t.numel() for n, t in state.items()}, 4)
    assert sum("wte" in n for f in fragments for n in f.tensor_names) == 1
    fresh = initial_model(replace(config, seed=3))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.lm.lm_head.weight, state["lm.transformer.wte.weight"])
    assert fresh.lm.lm_head.weight is fresh.lm.transformer.wte.weight


def test_its_loss_is_the_librarys_own_on_shifted_targets():
    torch.manual_seed(0)
    model = CausalLM(model_config(json.dumps(TINY_LLAMA), 16))
    ids = torch.randint(0, 256, (2, 17))

    logits, loss = model(ids[:, :-1], ids[:, 1:])

    assert torch.allclose(loss, model.lm(input_ids=ids, labels=ids).loss, atol=1e-5)
    assert torch.allclose(loss, F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()))


@pytest.mark.parametrize(("hf_config", "says"), [
    ({**TINY_LLAMA, "model_type": "no_such_model"}, "Unknown architecture 'no_such_model'"),
    ({**TINY_LLAMA, "auto_map": {"AutoModelForCausalLM": "x.Y"}}, "needs remote code"),
    ({"hidden_size": 64}, "has no model_type"),
])
def test_it_refuses_a_config_it_cannot_build_at_the_field(make_config, hf_config, says):
    with pytest.raises(ConfigError) as e:
        make_config(model=hf_model(hf_config))

    assert says in " ".join(e.value.errors["model.hf_config"])


def test_it_refuses_a_folder_without_config_json(make_config, tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config(model={"source": "hf", "hf_config": str(tmp_path)})

    assert "holds no config.json" in " ".join(e.value.errors["model.hf_config"])


def test_it_builds_from_a_folders_config_json(make_config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    folder = make_config(model={"source": "hf", "hf_config": str(tmp_path)})
    inline = make_config(model=hf_model(TINY_LLAMA))

    a, b = initial_model(folder).state_dict(), initial_model(inline).state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_it_refuses_an_hf_config_of_a_builtin_model(make_config):
    with pytest.raises(ConfigError) as e:
        make_config(model={"hf_config": json.dumps(TINY_LLAMA)})

    assert "Only with model.source hf" in " ".join(e.value.errors["model.hf_config"])


def test_a_builtin_run_never_imports_transformers(make_config):
    script = ("import sys; from diloco.config_parse import parse_config; "
              "from diloco.island import initial_model; from diloco.sizes import estimate; "
              "c = parse_config({}, ['us-east']); initial_model(c); estimate(c); "
              "sys.exit('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", script]).returncode == 0


def test_a_llama_trains_and_merges_in_the_cluster(make_config):
    config = make_config(model=hf_model(TINY_LLAMA),
                         sync={"inner_steps": 2, "fragments": 2, "overlap_steps": 0},
                         optim={"inner_lr": 1e-2, "warmup_steps": 0},
                         budget={"total_tokens": 2 * 4 * 16 * 8})

    result = run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)

    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    evaluator = Evaluator(config, corpus, "validation")
    assert result.outer_steps >= 2
    assert result.eval_loss < evaluator(initial_model(config).state_dict()) - 0.5


@pytest.mark.parametrize("shape", [TINY_LLAMA, TINY_GPT2])
def test_an_export_loads_in_transformers_with_the_same_logits_and_loss(make_config, tmp_path,
                                                                       shape):
    from transformers import AutoModelForCausalLM

    config = make_config(model=hf_model(shape))
    model = initial_model(config).eval()
    with torch.no_grad():  # weights a run could have trained, not the initial draw
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export(model.config, model.state_dict(), tmp_path, "readme")

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    evaluator = Evaluator(config, corpus, "validation")
    theirs = []
    with torch.no_grad():
        for x, y in evaluator.batches:
            logits, _ = model(x)
            assert torch.allclose(logits, loaded(input_ids=x).logits, rtol=0, atol=1e-4)
            whole = torch.cat([x, y[:, -1:]], dim=1)  # the library shifts its labels itself
            theirs.append(loaded(input_ids=whole, labels=whole).loss.item())
    assert sum(theirs) / len(theirs) == pytest.approx(evaluator(model.state_dict()), abs=1e-4)
    assert (tmp_path / "README.md").read_text() == "readme"


def test_the_llama_preset_has_about_20m_parameters_by_its_library_model():
    from diloco.config_parse import parse_config
    from diloco.presets import PRESETS
    from diloco.shapes import parameter_count

    config = parse_config(PRESETS["llama_20m"][1], ["us-east", "us-west"])

    assert 19_000_000 < parameter_count(config.model) < 21_000_000
    assert estimate(config).params == parameter_count(config.model)


def test_the_benchmarks_llama_preset_has_at_least_100m_parameters_by_its_library_model():
    from diloco.config_parse import parse_config
    from diloco.presets import PRESETS
    from diloco.shapes import parameter_count

    config = parse_config(PRESETS["llama_114m"][1], ["us-east", "us-west"])

    assert 100_000_000 <= parameter_count(config.model) < 120_000_000
    assert estimate(config).params == parameter_count(config.model)
