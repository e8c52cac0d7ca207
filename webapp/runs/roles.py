"""Who may do what. Every page, API endpoint and websocket asks here.

- viewer: any signed-in user; sees every run.
- operator: a member of the "operators" group (or anyone given the permissions):
  creates, starts, stops, pauses, resumes, checkpoints and deletes runs, injects
  faults, rejoins, adds and removes islands.
- admin: a superuser; everything above, manages users (Django admin) and may kill syncd.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group

OPERATORS = "operators"
OPERATOR_PERMISSIONS = ("add_run", "change_run", "delete_run", "operate_run", "inject_fault")
# action -> (permission, what the refusal says)
ACTIONS: dict[str, tuple[str | None, str]] = {
    "view": (None, "Sign in to see runs."),
    "create": ("runs.add_run", "Creating runs is for operators."),
    "operate": ("runs.operate_run",
                "Starting, stopping, pausing, resuming and checkpointing runs is for operators."),
    "edit": ("runs.change_run", "Changing runs (archive, islands) is for operators."),
    "delete": ("runs.delete_run", "Deleting runs is for operators."),
    "fault": ("runs.inject_fault", "Injecting faults and rejoining islands is for operators."),
    "admin": (None, "Only admins may do this."),
}


def can(user: AbstractBaseUser | AnonymousUser | None, action: str) -> bool:
    """Whether `user` may do `action` (a key of ACTIONS)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if action == "admin":
        return bool(user.is_superuser)
    permission = ACTIONS[action][0]
    return permission is None or user.has_perm(permission)


def require(user: AbstractBaseUser | AnonymousUser | None, action: str) -> None:
    """Raise PermissionDenied, with a sentence that says who may, unless `user` can."""
    if not can(user, action):
        raise PermissionDenied(ACTIONS[action][1])


def role(user: AbstractBaseUser | AnonymousUser | None) -> str:
    """The user's role in words: anonymous, viewer, operator or admin."""
    if user is None or not user.is_authenticated:
        return "anonymous"
    if user.is_superuser:
        return "admin"
    return "operator" if can(user, "operate") else "viewer"


def operators_group() -> Group:
    """The operators group with its permissions, made if it is missing (migration
    runs.0003_roles makes it; a test database flushed between tests loses it)."""
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name=OPERATORS)
    group.permissions.add(*Permission.objects.filter(content_type__app_label="runs",
                                                     codename__in=OPERATOR_PERMISSIONS))
    return group
