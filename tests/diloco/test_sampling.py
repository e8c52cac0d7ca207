from types import SimpleNamespace

import torch

from diloco.sampling import generate


class Favourite:
    """A model whose next token is always `token`, and which records the contexts it reads."""

    def __init__(self, token: int, block_size: int, vocab: int = 8):
        self.config = SimpleNamespace(block_size=block_size)
        self.token, self.vocab, self.seen = token, vocab, []

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, None]:
        self.seen.append(idx.shape[1])
        logits = torch.full((*idx.shape, self.vocab), -1e9)
        logits[..., self.token] = 0.0
        return logits, None


def test_generate_appends_the_models_tokens_reading_at_most_its_block_size():
    model = Favourite(token=5, block_size=4)
    prompt = torch.zeros(2, 6, dtype=torch.long)

    out = generate(model, prompt, 3, temperature=0.5)

    assert out.shape == (2, 9)
    assert torch.equal(out[:, :6], prompt)
    assert (out[:, 6:] == 5).all()
    assert model.seen == [4, 4, 4]


def test_generate_takes_no_gradients():
    class Graded(Favourite):
        def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, None]:
            assert not torch.is_grad_enabled()
            return super().__call__(idx)

    generate(Graded(token=1, block_size=2), torch.zeros(1, 1, dtype=torch.long), 2)
