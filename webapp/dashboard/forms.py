"""The new-run form: name, mode, a starting checkpoint, every setting of the run
config as a field of its own (named by its dotted path, with its default and its
one-line help), and the islands as rows that can be added and removed.

The form only collects values. diloco.config_parse.parse_config, through
lifecycle.create_run, is the one validator; its messages, keyed by dotted path,
are put back beside the field they name.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from django import forms
from django.http import QueryDict

from diloco.config import SECTIONS, IslandConfig, RunConfig
from diloco.config_parse import ConfigError
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Checkpoint, Run

ISLAND_FIELDS = [f.name for f in fields(IslandConfig)]
MAX_ISLAND_ROWS = 256
MAX_INDEX_DIGITS = 6


def _config_field(f: Any) -> forms.Field:
    meta = f.metadata
    common = {"label": f.name, "help_text": meta["help"]}
    if isinstance(f.default, bool):
        return forms.BooleanField(required=False, **common)
    if meta.get("choices"):
        return forms.ChoiceField(choices=[(c, c) for c in meta["choices"]], **common)
    # Numbers stay text here: parse_config says what is wrong with "abc" or 1e99.
    return forms.CharField(required=False, max_length=1000, **common)


def _number(raw: str) -> Any:
    """A number when the text is one, else the text, for parse_config to judge."""
    text = raw.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


class RunForm(forms.Form):
    name = forms.CharField(max_length=RUN_NAME_MAX_LENGTH)
    mode = forms.ChoiceField(choices=Run.Mode.choices, help_text=(
        "decoupled: Decoupled DiLoCo; sync: synchronous DiLoCo, every island waits for "
        "each merge (sync.min_quorum the number of islands, sync.overlap_steps 0); "
        "elastic: the elastic data-parallel baseline "
        "(a barrier at every outer step, a restart from checkpoint on any loss)."))
    initial_checkpoint = forms.ModelChoiceField(
        queryset=Checkpoint.objects.none(), required=False, label="start from checkpoint",
        help_text="The global model starts from this checkpoint; empty: a fresh model.")
    seed = forms.CharField(max_length=20, help_text=fields(RunConfig)[0].metadata["help"])

    def __init__(self, data: QueryDict | None = None, *, config: dict[str, Any],
                 **kwargs: Any):
        """`config` gives the values shown when the form is not bound (a preset)."""
        super().__init__(data, **kwargs)
        self.fields["initial_checkpoint"].queryset = (
            Checkpoint.objects.select_related("run").filter(run__isnull=False)
            .order_by("-created_at"))
        self.fields["seed"].initial = config["seed"]
        self.sections: dict[str, list[str]] = {}
        self.numbers: set[str] = set()  # the paths whose text is read as a number
        for section, cls in SECTIONS.items():
            self.sections[section] = []
            for f in fields(cls):
                path = f"{section}.{f.name}"
                self.fields[path] = _config_field(f)
                value = config.get(section, {}).get(f.name, f.default)
                self.fields[path].initial = "" if value is None else value
                self.sections[section].append(path)
                if not isinstance(f.default, bool | str):
                    self.numbers.add(path)
        self.island_rows = self._island_rows(data, config["islands"])
        self.islands_errors: list[str] = []

    def section_fields(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(section, [self[path] for path in paths])
                for section, paths in self.sections.items()]

    @staticmethod
    def _island_rows(data: QueryDict | None, islands: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
        """[{"values": {field: text}, "errors": {field: [message]}}] from the posted
        islands-<n>-<field> keys (in order of n), or from `islands`."""
        if data is None:
            return [{"values": {k: island.get(k, "") for k in ISLAND_FIELDS}, "errors": {}}
                    for island in islands]
        # An index is a short run of ASCII digits: int() refuses thousands of digits.
        indices = sorted({int(key.split("-")[1]) for key in data
                          if key.startswith("islands-") and key.count("-") >= 2
                          and key.split("-")[1].isascii() and key.split("-")[1].isdigit()
                          and len(key.split("-")[1]) <= MAX_INDEX_DIGITS})[:MAX_ISLAND_ROWS]
        return [{"values": {k: data.get(f"islands-{n}-{k}", "") for k in ISLAND_FIELDS},
                 "errors": {}} for n in indices]

    def config(self) -> dict[str, Any]:
        """The run config the form holds, as JSON-like values (call after is_valid)."""
        config: dict[str, Any] = {"seed": _number(self.cleaned_data.get("seed", ""))}
        for section, paths in self.sections.items():
            values = {}
            for path in paths:
                value = self.cleaned_data.get(path)
                if path in self.numbers:
                    value = None if not value.strip() else _number(value)
                values[path.split(".", 1)[1]] = value
            config[section] = values
        config["islands"] = []
        for row in self.island_rows:
            island = {}
            for key, text in row["values"].items():
                island[key] = text.strip() if key in ("name", "region") else _number(text)
            config["islands"].append(island)
        return config

    def add_config_error(self, e: ConfigError) -> None:
        """Put create_run's messages beside their fields: the form's own, a config
        setting's, an island row's, or above the islands."""
        for path, messages in sorted(e.errors.items()):
            parts = path.split(".")
            if path in self.fields:
                for message in messages:
                    self.add_error(path, message)
            elif parts[0] == "islands" and len(parts) == 3 and parts[1].isdigit() \
                    and int(parts[1]) < len(self.island_rows):
                self.island_rows[int(parts[1])]["errors"].setdefault(parts[2], []).extend(
                    messages)
            elif parts[0] == "islands":
                self.islands_errors.extend(messages)
            else:
                for message in messages:
                    self.add_error(None, f"{path}: {message}")
