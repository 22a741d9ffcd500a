"""Forms of the console: a segment view's filter, a selection of tasks, the purge confirmation, a queue's limits."""

from __future__ import annotations

import re
from collections.abc import Callable

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from threadmill import api
from threadmill.limits import LimitError, Rate, parse_concurrency, parse_rate

#: Most tasks one "requeue selected" or "delete selected" may name.
MAX_SELECTION = 500
# Matched with fullmatch: a `$` anchor would also pass an id with a trailing newline.
_TASK_ID = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


class FilterForm(forms.Form):
    """Filter a segment by task path and by error class (exact dotted paths), and by text in its arguments."""

    task = forms.CharField(required=False, max_length=200, label="Task path")
    error = forms.CharField(required=False, max_length=200, label="Error class")
    q = forms.CharField(required=False, max_length=200, strip=False, label="Text")

    def clean(self):
        super().clean()
        data = self.cleaned_data
        try:
            data["where"] = api.Filter(
                task_path=data.get("task", ""), error_class=data.get("error", ""), text=data.get("q", "")
            )
        except ValueError as e:
            raise ValidationError(str(e)) from e
        return data


class ForceForm(forms.Form):
    """Whether a requeue forces running tasks whose workers are alive and leases current (they may run twice)."""

    force = forms.ChoiceField(
        choices=[("", "no"), ("yes", "yes")],
        required=False,
        error_messages={"invalid_choice": "The force field is either 'yes' or absent."},
    )

    def clean_force(self) -> bool:
        return self.cleaned_data["force"] == "yes"


class SeenSegmentForm(forms.Form):
    """The segment a task page showed its task in: a requeue leaves a task that has left it since."""

    seen = forms.ChoiceField(
        choices=[("", "unknown"), *((str(s), str(s)) for s in api.Segment)],
        required=False,
        error_messages={
            "invalid_choice": "The seen field names a segment (ready, deferred, running, ...) or is absent."
        },
    )

    def clean_seen(self) -> api.Segment | None:
        return api.Segment(self.cleaned_data["seen"]) if self.cleaned_data["seen"] else None


class SelectionForm(ForceForm):
    """What an action applies to: the selected task ids, or the whole (filtered) view, and whether it is forced."""

    scope = forms.ChoiceField(choices=[("selected", "selected"), ("view", "view")], initial="selected")
    ids = forms.CharField(required=False, widget=forms.MultipleHiddenInput)

    def __init__(self, data=None, **kwargs):
        super().__init__(data, **kwargs)
        self.task_ids = data.getlist("ids") if data is not None and hasattr(data, "getlist") else []

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if len(self.task_ids) > MAX_SELECTION:
            raise ValidationError(f"Select at most {MAX_SELECTION} tasks at a time, or act on the whole view.")
        bad = [task_id for task_id in self.task_ids if not _TASK_ID.fullmatch(task_id)]
        if bad:
            raise ValidationError("The selection holds a malformed task id.")
        if data.get("scope") == "selected" and not self.task_ids:
            raise ValidationError("Select at least one task.")
        data["ids"] = list(dict.fromkeys(self.task_ids))
        return data


class PurgeForm(forms.Form):
    """Purging a segment asks the user to type the queue's name."""

    confirm = forms.CharField(max_length=200, label="Type the queue name to confirm")

    def __init__(self, *args, queue_name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.queue_name = queue_name

    def clean_confirm(self):
        value = self.cleaned_data["confirm"]
        if value != self.queue_name:
            raise ValidationError(f"Type the queue name, {self.queue_name}, exactly to purge it.")
        return value


#: Tasks a bulk cancel may touch with a click; above this many the queue's name must be typed.
TYPED_CANCEL_ABOVE = 100


class CancelConfirmForm(forms.Form):
    """Cancelling more than `TYPED_CANCEL_ABOVE` tasks asks the user to type the queue's name."""

    confirm = forms.CharField(required=False, max_length=200, label="Type the queue name to confirm")

    def __init__(self, *args, queue_name: str, count: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.queue_name, self.count = queue_name, count

    @property
    def typed(self) -> bool:
        """Whether this many tasks need the queue name typed."""
        return self.count > TYPED_CANCEL_ABOVE

    def clean_confirm(self):
        value = self.cleaned_data["confirm"]
        if self.typed and value != self.queue_name:
            raise ValidationError(
                f"Type the queue name, {self.queue_name}, exactly to cancel more than {TYPED_CANCEL_ABOVE} tasks."
            )
        return value


class LimitForm(forms.Form):
    """A queue's runtime concurrency and/or rate; a field left empty keeps the part in force at runtime."""

    concurrency = forms.CharField(required=False, max_length=12, label="Concurrency")
    rate = forms.CharField(required=False, max_length=20, label="Rate")

    def clean_concurrency(self) -> int | None:
        return _limit_part(parse_concurrency, self.cleaned_data["concurrency"])

    def clean_rate(self) -> Rate | None:
        return _limit_part(parse_rate, self.cleaned_data["rate"])

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if not self.errors and data.get("concurrency") is None and data.get("rate") is None:
            raise ValidationError("Give a concurrency, a rate or both.")
        return data


def _limit_part[T](parse: Callable[[str], T], text: str) -> T | None:
    try:
        return parse(text) if text else None
    except LimitError as e:
        raise ValidationError(str(e)) from None


def reason(form: forms.Form) -> str:
    """Return a form's errors as one sentence for a 400 page, each field's prefixed by its name."""
    return " ".join(
        str(message) if name == NON_FIELD_ERRORS else f"{name.capitalize()}: {message}"
        for name, messages in form.errors.items()
        for message in messages
    )


class SearchForm(forms.Form):
    """The search box: a task id, or text to filter the current segment by; the segment comes along as hidden fields."""

    q = forms.CharField(max_length=200, strip=True, label="Search")
    backend = forms.CharField(required=False, max_length=100)
    queue = forms.CharField(required=False, max_length=200)
    segment = forms.ChoiceField(required=False, choices=[("", "")] + [(s.value, s.value) for s in api.Segment])

    @property
    def task_id(self) -> str | None:
        """The query, when it has the shape of a task id."""
        q = self.cleaned_data["q"]
        return q if _TASK_ID.fullmatch(q) else None
