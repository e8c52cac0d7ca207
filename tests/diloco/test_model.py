import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diloco.model import GPT, VOCAB_SIZE, GPTConfig, embedding_tensor_names

ROOT = Path(__file__).resolve().parents[2]
CONFIG = GPTConfig(n_layer=1, n_embd=32, n_head=4, block_size=16)


def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def test_it_returns_logits_over_the_256_byte_values_for_every_position():
    idx = torch.randint(VOCAB_SIZE, (3, 10))

    logits, loss = model()(idx)

    assert logits.shape == (3, 10, VOCAB_SIZE)
    assert loss is None


def test_the_loss_at_init_is_near_that_of_a_uniform_guess():
    idx = torch.randint(VOCAB_SIZE, (4, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(VOCAB_SIZE, (4, 16), generator=torch.Generator().manual_seed(2))

    _, loss = model()(idx, targets)

    assert loss.shape == ()
    assert loss.item() == pytest.approx(math.log(VOCAB_SIZE), abs=0.1)


def test_it_rejects_a_sequence_longer_than_block_size():
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
        model()(torch.zeros(1, 17, dtype=torch.long))


def test_it_accepts_a_sequence_exactly_block_size_long():
    logits, _ = model()(torch.zeros(2, 16, dtype=torch.long))

    assert logits.shape == (2, 16, VOCAB_SIZE)


def test_the_output_at_a_position_does_not_depend_on_later_bytes():
    m = model()
    idx = torch.randint(VOCAB_SIZE, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % VOCAB_SIZE

    with torch.no_grad():
        a, _ = m(idx)
        b, _ = m(changed)

    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)
    assert not torch.allclose(a[0, 8:], b[0, 8:])


def test_the_embeddings_are_untied_from_the_output_head():
    m = model()
    names = dict(m.named_parameters())

    assert "lm_head.weight" in names
    assert names["lm_head.weight"].data_ptr() != names["tok_emb.weight"].data_ptr()
    assert set(embedding_tensor_names()) <= set(names)


def test_generate_appends_the_requested_number_of_bytes_reproducibly():
    m = model()
    prompt = torch.zeros(1, 20, dtype=torch.long)  # longer than block_size: it is cropped

    a = m.generate(prompt, 5, generator=torch.Generator().manual_seed(3))
    b = m.generate(prompt, 5, generator=torch.Generator().manual_seed(3))

    assert a.shape == (1, 25)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :20], prompt)


def test_a_model_built_without_init_on_meta_imports_no_compiler():
    # A normal draw on the meta device goes through torch's Python reference, whose
    # first use imports torch._dynamo and sympy (about 80 MB): the evaluator's model,
    # built on meta to take assigned tensors, must not draw.
    code = ("import sys, torch\n"
            "from diloco.model import GPT, GPTConfig\n"
            "with torch.device('meta'):\n"
            "    model = GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2), init=False)\n"
            "assert all(p.is_meta for p in model.parameters())\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'sympy'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_model_built_without_init_runs_once_given_its_tensors():
    config = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
    source = GPT(config)
    with torch.device("meta"):
        model = GPT(config, init=False)
    model.load_state_dict(source.state_dict(), assign=True)
    x = torch.randint(0, 256, (2, 8))
    assert torch.equal(model(x)[0], source(x)[0])
