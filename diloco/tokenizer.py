"""The run's tokenizer (`data.tokenizer`): text into the token ids a corpus is prepared as.

Three kinds:

- `bytes` (the default): a token is a byte, its id the byte's value (256 ids); a
  document of JSON Lines or Parquet ends with a NUL byte (id 0), which no text holds.
- a local folder holding a `tokenizer.json` of the `tokenizers` library (inside
  DATA_ROOTS, like data.path); its EOS is the first of its special tokens named in
  EOS_NAMES, or none.
- `train`: a byte-level BPE of `data.vocab_size` ids, trained with `tokenizers` on the
  run's train split once, when the corpus is prepared, and stored beside the prepared
  files (diloco/data.py); its EOS is `<|endoftext|>`, id 0. Training is deterministic,
  so every host that prepares the corpus trains the same one.

A tokenizer is named by the sha256 of its `tokenizer.json` (`bytes` for bytes), which
the prepared corpus records, every island and syncd compare and each checkpoint holds.
`tokenizers` is imported only by the functions that use it: a bytes run never loads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

BYTES = "bytes"
TRAIN = "train"
BYTE_VOCAB = 256
TOKENIZER_FILE = "tokenizer.json"
TRAINED_EOS = "<|endoftext|>"
EOS_NAMES = (TRAINED_EOS, "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
MAX_VOCAB = 1 << 22  # a vocabulary the prepared files' uint32 ids hold, and then some


class TokenizerError(ValueError):
    """`data.tokenizer` names no tokenizer that can be read; the message says why."""


class TokenizerChoice(Protocol):
    """The settings the tokenizer depends on (diloco.config.DataConfig has them)."""

    tokenizer: str
    vocab_size: int
    text_field: str


def check_tokenizer(mine: str, runs: str) -> None:
    """Raises TokenizerError unless this process' tokenizer hash `mine` is the run's."""
    if mine != runs:
        raise TokenizerError(f"This host's tokenizer (sha256 {mine}) is not the run's "
                             f"({runs}): its corpus or tokenizer folder differs from the "
                             "other hosts'.")


def vocab_of(data: TokenizerChoice) -> int:
    """The ids the run's tokenizer makes, without building it (a folder's tokenizer.json
    is read as JSON). Raises TokenizerError for a folder that holds none."""
    if data.tokenizer == BYTES:
        return BYTE_VOCAB
    if data.tokenizer == TRAIN:
        return data.vocab_size
    return _json_vocab(read_json(data.tokenizer))


def problems(data: TokenizerChoice, model: Any) -> Iterator[tuple[str, str]]:
    """(dotted path, message) for each problem of the run's tokenizer: one that cannot be
    read, too many ids, no text field, or more ids than the rows of an hf model's
    embedding (`model`: diloco.config.ModelConfig; the builtin one takes the ids)."""
    try:
        vocab = vocab_of(data)
    except TokenizerError as e:
        yield "data.tokenizer", str(e)
        return
    if vocab > MAX_VOCAB:
        yield "data.tokenizer", f"Has {vocab:,} ids; at most {MAX_VOCAB:,}."
    if not data.text_field.strip():
        yield "data.text_field", "This field is required."
    if model.source != "hf":
        return
    from diloco.hf import HFConfigError, read_config

    try:
        rows = read_config(model.hf_config).get("vocab_size", vocab)
    except HFConfigError:
        return  # model.hf_config's own rule says why
    if not isinstance(rows, int) or rows < vocab:
        yield "data.tokenizer", (f"The tokenizer's {vocab:,} ids do not fit the model's "
                                 f"embedding of {rows!r} (model.hf_config vocab_size): "
                                 "leave vocab_size out to take the tokenizer's.")


def read_json(folder: str) -> dict[str, Any]:
    """The tokenizer.json of the local `folder`, decoded (raises TokenizerError)."""
    path = Path(folder.strip()).expanduser()
    if not folder.strip() or not path.is_dir():
        raise TokenizerError(f"Must be bytes, train or a folder holding {TOKENIZER_FILE}; "
                             f"no folder at {folder!r}.")
    file = path / TOKENIZER_FILE
    if not file.is_file():
        raise TokenizerError(f"The folder {folder!r} holds no {TOKENIZER_FILE}.")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{file} is not readable JSON: {e}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenizerError(f"{file} is no tokenizer of the tokenizers library (no model).")
    return data


def _json_vocab(data: dict[str, Any]) -> int:
    """One more than the largest id of a tokenizer.json's vocabulary and added tokens."""
    vocab = data["model"].get("vocab")
    if isinstance(vocab, dict):
        ids = [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
        ids = [len(vocab) - 1] if vocab else []
    else:
        ids = []
    ids += [t["id"] for t in data.get("added_tokens") or []
            if isinstance(t, dict) and isinstance(t.get("id"), int)]
    if not ids:
        raise TokenizerError("The tokenizer.json has an empty vocabulary.")
    return max(ids) + 1


class Tokenizer:
    """Text into ids: bytes, or a `tokenizers.Tokenizer` (its JSON in `json_text`).

    Attributes:
        vocab_size: the ids it makes (one more than the largest).
        eos: the id that ends a document, or None.
        sha256: `bytes`, else the sha256 of tokenizer.json: equal ones tokenize alike.
    """

    def __init__(self, json_text: str | None = None):
        self.json_text = json_text
        if json_text is None:
            self.library = None
            self.vocab_size, self.eos, self.sha256 = BYTE_VOCAB, 0, BYTES
            return
        from tokenizers import Tokenizer as Library

        self.library = Library.from_str(json_text)
        self.vocab_size = _json_vocab(json.loads(json_text))
        self.eos = next((i for name in EOS_NAMES
                         if (i := self.library.token_to_id(name)) is not None), None)
        self.sha256 = hashlib.sha256(json_text.encode()).hexdigest()

    @property
    def eos_token(self) -> str | None:
        """The EOS as text, for a transformers tokenizer of this one."""
        if self.library is None or self.eos is None:
            return None
        return self.library.id_to_token(self.eos)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, no special tokens added."""
        if self.library is None:
            return [list(text.encode()) for text in texts]
        return [e.ids for e in self.library.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`; those beyond the vocabulary (an hf model's spare rows) are
        left out, bytes split mid-character replaced."""
        kept = [i for i in ids if 0 <= i < self.vocab_size]
        if self.library is None:
            return bytes(kept).decode("utf-8", errors="replace")
        return self.library.decode(kept, skip_special_tokens=False)

    def dtype_bytes(self) -> int:
        """Bytes per id in the prepared files: 1 for bytes, 2 below 65,536 ids, else 4."""
        if self.library is None:
            return 1
        return 2 if self.vocab_size <= 1 << 16 else 4


def from_folder(folder: str) -> Tokenizer:
    """The tokenizer of the local folder's tokenizer.json (raises TokenizerError)."""
    read_json(folder)
    text = (Path(folder.strip()).expanduser() / TOKENIZER_FILE).read_text()
    try:
        return Tokenizer(text)
    except Exception as e:  # the library's own error type for a file it cannot build
        raise TokenizerError(f"The tokenizers library cannot read {folder!r}: {e}") from None


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids trained on `texts`: the 256 byte symbols,
    the EOS `<|endoftext|>` (id 0) and merges up to vocab_size."""
    from tokenizers import Tokenizer as Library
    from tokenizers import decoders, models, pre_tokenizers, trainers

    made = Library(models.BPE())
    made.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    made.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[TRAINED_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    made.train_from_iterator(texts, trainer)
    return Tokenizer(made.to_str())


def byte_tokenizer_json() -> str:
    """A tokenizer.json whose ids are the bytes tokenizer's (id = byte value): a
    byte-level BPE without merges, for an export that transformers loads."""
    from tokenizers import Tokenizer as Library
    from tokenizers import decoders, models, pre_tokenizers

    symbols = _byte_symbols()
    made = Library(models.BPE(vocab={symbols[b]: b for b in range(BYTE_VOCAB)}, merges=[]))
    made.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    made.decoder = decoders.ByteLevel()
    return made.to_str()


def _byte_symbols() -> list[str]:
    """The character byte-level BPE writes for each byte value (GPT-2's table)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(BYTE_VOCAB)]
