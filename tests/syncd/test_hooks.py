"""What syncd asks of the side that starts it (syncd.hooks): the web app's recorder
answers every call of the Recorder protocol with the same parameters, and Hooks are
fixed once made."""

import dataclasses
import inspect

import pytest

from syncd.hooks import Hooks, Recorder
from webapp.runs.records import DatabaseRecorder

CALLS = [name for name, value in vars(Recorder).items()
         if inspect.isfunction(value) and not name.startswith("_")]


def test_the_protocol_names_the_calls_syncd_makes():
    assert CALLS == ["event", "island", "metric", "progress", "flush", "checkpoint",
                     "checkpoint_evaluated", "checkpoints", "recover_merges", "end"]


@pytest.mark.parametrize("name", CALLS)
def test_the_web_apps_recorder_takes_each_call_as_the_protocol_declares_it(name):
    declared = inspect.signature(getattr(Recorder, name))
    implemented = inspect.signature(getattr(DatabaseRecorder, name))

    assert list(implemented.parameters) == list(declared.parameters)


def test_hooks_without_a_notifier_push_nothing_and_cannot_be_changed():
    hooks = Hooks(recorder=DatabaseRecorder, rejoin=lambda run_id, island: None)

    assert hooks.notify is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        hooks.notify = print
