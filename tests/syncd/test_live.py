import copy

import pytest

from syncd.live import LiveNotifier, apply, delta, status_group


def test_a_delta_applied_to_the_old_status_gives_the_new_one():
    old = {"time": 1.0, "versions": [1, 2], "islands": {"a": {"state": "training", "tokens": 5},
                                                        "b": {"state": "lost"}}}
    new = {"time": 1.5, "versions": [2, 2], "islands": {"a": {"state": "training", "tokens": 9},
                                                        "c": {"state": "starting"}}}

    ops = delta(old, new)

    assert apply(copy.deepcopy(old), ops) == new


def test_a_delta_names_only_what_changed():
    old = {"goodput": 0.9, "islands": {"a": {"tokens": 5, "state": "training"}}}
    new = {"goodput": 0.9, "islands": {"a": {"tokens": 6, "state": "training"}}}

    assert delta(old, new) == [[["islands", "a", "tokens"], 6]]


def test_lists_and_none_values_are_set_whole_and_removed_keys_deleted():
    ops = delta({"versions": [1, 2], "eval_loss": 2.0, "gone": 1},
               {"versions": [1, 3], "eval_loss": None})

    assert ops == [[["versions"], [1, 3]], [["eval_loss"], None], [["gone"]]]


@pytest.mark.parametrize("op", [[], [[]], "x", [["a"], 1, 2]])
def test_apply_refuses_malformed_ops(op):
    with pytest.raises(ValueError, match="an op is"):
        apply({}, [op])


def test_the_notifier_sends_the_whole_status_first_then_deltas_on_their_base():
    sent = []
    notify = LiveNotifier(lambda group, message: sent.append((group, message)), status_group)

    notify("7", 1, {"versions": [1], "time": 1.0})
    notify("7", 2, {"versions": [2], "time": 1.5})

    assert sent[0] == ("run-7", {"type": "run.status", "seq": 1,
                                 "status": {"versions": [1], "time": 1.0}})
    assert sent[1] == ("run-7", {"type": "run.delta", "seq": 2, "base": 1,
                                 "ops": [[["versions"], [2]], [["time"], 1.5]]})


def test_after_a_failed_send_the_notifier_starts_again_with_a_whole_status():
    sent = []

    def flaky(group, message):
        if message["seq"] == 2:
            raise ConnectionError("channel layer down")
        sent.append(message)

    notify = LiveNotifier(flaky, status_group)
    for seq in (1, 2, 3):
        notify("7", seq, {"seq_was": seq})

    assert [(m["type"], m["seq"]) for m in sent] == [("run.status", 1), ("run.status", 3)]

