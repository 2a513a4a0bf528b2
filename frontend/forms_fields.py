"""Form fields that validate through the API's own serializer fields, so a page and the API
accept and refuse the same values with the same messages: one definition of each field.

`ApiField(OrderInSerializer, "image")` takes the serializer's declared field (a copy) and,
like the serializer, its `validate_<name>` method. The form's text becomes the JSON value
the API would receive (`to_json`: a whole number, a word list, a port list, or the text
itself), the API field cleans it, and its messages become the form's: a list item's as the
API names it (`command[3]: …`). Every field refuses NUL and lone surrogates first, with the
API parser's message (core.text.bad_character_message): PostgreSQL cannot store
them.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable

from django import forms
from rest_framework import serializers
from rest_framework.exceptions import ValidationError as ApiValidationError
from rest_framework.fields import SkipField, empty

from core.text import bad_character_message
from marketplace.api.errors import _flatten

_WHOLE = re.compile(r"-?[0-9]{1,4000}")  # ASCII digits only, as JSON (int() takes "٣" and "1_0")


def whole_number(text: str):
    """ "12" → 12; anything else stays text, which an integer field refuses as the API
    refuses a JSON string ("A valid integer is required.")."""
    text = text.strip()
    return int(text) if _WHOLE.fullmatch(text) else text


def words(text: str) -> list[str]:
    """A command line split like a shell would (no shell runs it) → list of strings."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise forms.ValidationError(f"cannot be split into words: {exc}") from None


def port_list(text: str) -> list:
    """Ports comma- or space-separated ("8888, 6006") → [8888, 6006] (a word that is not a
    whole number stays text, which the API's port field refuses)."""
    return [whole_number(w) for w in text.replace(",", " ").split()]


def name_value_lines(text: str):
    """ "NAME=VALUE" lines (blank ones skipped) → {NAME: VALUE}, for the API's env and
    secrets field to judge. A line without "=" or a name given twice is refused here; the
    message names the line, never its text (it may hold a secret)."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise forms.ValidationError(f"line {number} is not NAME=VALUE")
        name = name.strip()
        if name in out:
            raise forms.ValidationError(f"{name} is given twice")
        out[name] = value
    return out


class WriteOnlyTextarea(forms.Textarea):
    """A textarea whose value is never rendered back (a form re-shown after an error
    comes back empty: a secret is never echoed into a page)."""

    def format_value(self, value):
        return None


class ApiField(forms.Field):
    """A form field whose value is cleaned by `serializer_class`'s field `name` (see the
    module docstring). `required` (default: the API field's) makes an empty entry "This
    field is required."; an optional empty entry is the API's default (None without one),
    as a field left out of a JSON body."""

    def __init__(self, serializer_class: type[serializers.Serializer], name: str, *,
                 to_json: Callable[[str], object] = str, required: bool | None = None,
                 widget: forms.Widget | None = None, **kwargs):
        self.api_field = copy.deepcopy(serializer_class._declared_fields[name])
        self.api_field.bind(field_name=name, parent=None)
        self.check = getattr(serializer_class, f"validate_{name}", None)
        self.serializer_class, self.name, self.to_json = serializer_class, name, to_json
        required = self.api_field.required if required is None else required
        super().__init__(required=required, widget=widget or self._widget(), **kwargs)

    def _widget(self) -> forms.Widget:
        low = getattr(self.api_field, "min_value", None)
        high = getattr(self.api_field, "max_value", None)
        if isinstance(self.api_field, serializers.IntegerField):
            return forms.NumberInput(attrs={k: v for k, v in (("min", low), ("max", high))
                                            if v is not None})
        if isinstance(self.api_field, serializers.ChoiceField):
            return forms.Select(choices=list(self.api_field.choices.items()))
        length = getattr(self.api_field, "max_length", None)
        if isinstance(self.api_field, serializers.CharField) and length:
            return forms.TextInput(attrs={"maxlength": str(length)})
        return forms.TextInput()

    def to_python(self, value):
        text = "" if value is None else str(value)
        message = bad_character_message(text)
        if message is not None:
            raise forms.ValidationError(message)
        if text == "":  # not given (a blank entry is the API field's to judge)
            if self.required:
                raise forms.ValidationError(self.api_field.error_messages["required"])
            data = empty
        else:
            data = self.to_json(text)
        try:
            value = self.api_field.run_validation(data)
            if self.check is not None and data is not empty:
                value = self.check(self.serializer_class(), value)
        except SkipField:
            return None
        except ApiValidationError as exc:
            raise forms.ValidationError(_messages(self.name, exc.detail)) from None
        return value

    def validate(self, value):
        pass  # required and everything else: to_python, by the API's field


def _messages(name: str, detail) -> list[str]:
    """The API's messages for field `name`: its own plain, its items' as the API names
    them (`command[3]: …`)."""
    return [message if path == name else f"{path}: {message}"
            for path, message in _flatten({name: detail})]
