"""Who may do what (webapp.runs.roles): anonymous, viewer, operator and admin, each
action's refusal in a sentence."""

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.core.exceptions import PermissionDenied

from webapp.runs.roles import ACTIONS, OPERATORS, can, operators_group, require, role

pytestmark = pytest.mark.django_db

OPERATOR_ACTIONS = ("view", "create", "operate", "edit", "delete", "fault")


def test_nobody_signed_in_may_do_anything():
    for user in (None, AnonymousUser()):
        assert role(user) == "anonymous"
        assert not [action for action in ACTIONS if can(user, action)]


def test_a_viewer_may_only_view(viewer):
    assert role(viewer) == "viewer"
    assert [action for action in ACTIONS if can(viewer, action)] == ["view"]


def test_an_operator_may_do_all_but_admins_things(operator):
    assert role(operator) == "operator"
    assert tuple(action for action in ACTIONS if can(operator, action)) == OPERATOR_ACTIONS


def test_an_admin_may_do_everything(admin):
    assert role(admin) == "admin"
    assert all(can(admin, action) for action in ACTIONS)


def test_a_deactivated_operator_may_do_nothing(operator):
    operator.is_active = False

    assert not [action for action in ACTIONS if can(operator, action)]


def test_an_unknown_action_is_an_error_naming_the_known_ones(admin):
    with pytest.raises(ValueError, match="unknown action 'fly'; expected one of view, create"):
        can(admin, "fly")


def test_a_refusal_says_who_may(viewer):
    require(viewer, "view")
    with pytest.raises(PermissionDenied, match="Deleting runs is for operators"):
        require(viewer, "delete")
    with pytest.raises(PermissionDenied, match="Only admins may do this"):
        require(viewer, "admin")


def test_the_operators_group_is_made_again_with_its_permissions_when_missing():
    Group.objects.filter(name=OPERATORS).delete()

    group = operators_group()

    assert group.name == OPERATORS
    assert sorted(p.codename for p in group.permissions.all()) == [
        "add_run", "change_run", "delete_run", "inject_fault", "operate_run"]
    assert operators_group() == group
