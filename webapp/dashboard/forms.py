import json
from typing import Any

from django import forms

from trainer.config import ConfigError
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Run


class RunForm(forms.Form):
    name = forms.CharField(max_length=RUN_NAME_MAX_LENGTH)
    mode = forms.ChoiceField(choices=Run.Mode.choices)
    config = forms.CharField(widget=forms.Textarea(attrs={"rows": 30, "spellcheck": "false"}),
                             help_text="The run config as JSON; missing fields take their "
                                       "defaults.")

    def clean_config(self) -> Any:
        try:
            return json.loads(self.cleaned_data["config"])
        except (ValueError, RecursionError) as e:
            raise forms.ValidationError(f"Not valid JSON: {e}.") from None

    def add_config_error(self, e: ConfigError) -> None:
        """Show create_run's errors: the run's own fields on themselves, the config's
        beside the config field with their dotted paths."""
        for path, messages in sorted(e.errors.items()):
            for message in messages:
                if path in ("name", "mode"):
                    self.add_error(path, message)
                else:
                    self.add_error("config", f"{path}: {message}")
