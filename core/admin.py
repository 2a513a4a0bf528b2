"""The admin's one way to show a model: query strings whitelisted, secret columns masked.

Django alone takes any lookup on a local field (`?price__gte=N`) and any sort column;
`StrictAdmin` answers 400, naming the parameter, to anything but paging, its declared list
filters, `q` where search fields are declared and `o` on a sortable column; `secret_fields`
are never filtered, sorted or searched on (a system check refuses it) and show "sealed" on
the rows `sealed_q()` matches, for every staff user. Every admin of the project's apps
derives from these (tests/test_admin_pages.py checks it); docs/ARCHITECTURE.md, "admin".
"""

from __future__ import annotations

import re

from django.contrib import admin
from django.contrib.admin.filters import FieldListFilter
from django.contrib.admin.options import IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, ORDER_VAR, PAGE_VAR, SEARCH_VAR
from django.core import checks
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Q, Value
from django.http import HttpResponseBadRequest

SEALED_TEXT = "sealed"
PLAIN_PARAMS = frozenset({ALL_VAR, PAGE_VAR, ERROR_FLAG, IS_POPUP_VAR, TO_FIELD_VAR,
                          IS_FACETS_VAR})
_ORDER_PART = re.compile(r"-?\d+")


class SealedFieldsMixin:
    """Masks `secret_fields` on the rows `sealed_q()` matches. Each secret field `f` is
    shown through a column `sealed_f` (no sorting); an object that was not loaded through
    `get_queryset` (so carries no `_sealed` flag) is masked: fail closed."""

    secret_fields: tuple[str, ...] = ()

    def sealed_q(self) -> Q | None:
        """The rows whose secret fields are masked; None when no row is."""
        return None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.secret_fields:
            setattr(self, f"sealed_{name}", self._masker(name))

    def _masker(self, name: str):
        field = self.model._meta.get_field(name)

        def show(obj):
            if getattr(obj, "_sealed", True):
                return SEALED_TEXT
            return getattr(obj, name)

        show.short_description = field.verbose_name
        show.__name__ = f"sealed_{name}"
        return show

    def _shown(self, names) -> list:
        """`names` with each secret field replaced by its masked column, once each."""
        secret = set(self.secret_fields)
        shown: list = []
        for name in names:
            name = f"sealed_{name}" if isinstance(name, str) and name in secret else name
            if name not in shown:
                shown.append(name)
        return shown

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        q = self.sealed_q() if self.secret_fields else None
        if q is None:
            return qs.annotate(_sealed=Value(False, output_field=BooleanField()))
        return qs.annotate(_sealed=ExpressionWrapper(q, output_field=BooleanField()))

    def get_fields(self, request, obj=None):
        return self._shown(super().get_fields(request, obj))

    def get_fieldsets(self, request, obj=None):
        return [(title, {**opts, "fields": self._shown(opts["fields"])})
                for title, opts in super().get_fieldsets(request, obj)]

    def get_readonly_fields(self, request, obj=None):
        return self._shown([*super().get_readonly_fields(request, obj),
                            *(f"sealed_{n}" for n in self.secret_fields)])

    def get_exclude(self, request, obj=None):
        excluded = super().get_exclude(request, obj)
        if not self.secret_fields:
            return excluded
        return [*(excluded or ()), *self.secret_fields]


class StrictAdmin(SealedFieldsMixin, admin.ModelAdmin):
    """A ModelAdmin whose changelist takes only the query parameters it declares."""

    def get_list_display(self, request):
        return self._shown(super().get_list_display(request))

    # -- what the query string may hold ---------------------------------------------------

    def lookup_allowed(self, lookup, value, request=None):
        return lookup in self._filter_parameters(request)

    def _filter_parameters(self, request) -> frozenset[str]:
        """The parameters of the declared list filters (and date hierarchy), exactly."""
        cache = getattr(request, "_strict_admin_filters", None)
        if cache is None:
            cache = {}
            if request is not None:
                request._strict_admin_filters = cache
        if self in cache:
            return cache[self]
        names: set[str] = set()
        for item in self.get_list_filter(request):
            if isinstance(item, (tuple, list)):
                path, make = item
            elif callable(item):
                names.update(item(request, {}, self.model, self).expected_parameters())
                continue
            else:
                path, make = item, FieldListFilter.create
            field = get_fields_from_path(self.model, path)[-1]
            names.update(make(field, request, {}, self.model, self,
                              field_path=path).expected_parameters())
        if self.date_hierarchy:
            names.update(f"{self.date_hierarchy}__{part}" for part in ("year", "month", "day"))
        cache[self] = frozenset(names)
        return cache[self]

    def _columns(self, request) -> list:
        columns = list(self.get_list_display(request))
        if self.get_actions(request):
            columns.insert(0, "action_checkbox")
        return columns

    def _order_field(self, column) -> str | None:
        """The model field a column sorts by (None: it does not sort)."""
        if not isinstance(column, str):
            return getattr(column, "admin_order_field", None)
        try:
            return self.model._meta.get_field(column).name
        except FieldDoesNotExist:
            attr = getattr(self, column, None) or getattr(self.model, column, None)
            if isinstance(attr, property):
                attr = attr.fget
            return getattr(attr, "admin_order_field", None)

    def _sortable(self, request, column) -> bool:
        if column not in self.get_sortable_by(request):
            return False
        field = self._order_field(column)
        if not isinstance(field, str):
            return False
        return field.lstrip("-").split("__")[0] not in self.secret_fields

    def query_problem(self, request) -> str | None:
        """What is wrong with the changelist's query string, as a sentence; None: nothing."""
        filters = self._filter_parameters(request)
        search = bool(self.get_search_fields(request))
        for name in request.GET:
            if name in PLAIN_PARAMS or name in filters or (search and name == SEARCH_VAR):
                continue
            if name == ORDER_VAR:
                problem = self._ordering_problem(request, request.GET.getlist(name))
                if problem:
                    return problem
                continue
            offered = sorted(filters | ({SEARCH_VAR} if search else set()) | {ORDER_VAR})
            return (f"{name}: not a parameter of this list; it takes "
                    f"{', '.join(offered)} (and paging)")
        return None

    def _ordering_problem(self, request, values: list[str]) -> str | None:
        columns = self._columns(request)
        for value in values:
            for part in filter(None, value.split(".")):
                if not _ORDER_PART.fullmatch(part):
                    return f"o: {part!r} is not a column number"
                index = int(part.lstrip("-"))
                if index >= len(columns) or not self._sortable(request, columns[index]):
                    return f"o: column {index} of this list cannot be sorted on"
        return None

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        problem = self.query_problem(request)
        if problem:
            return HttpResponseBadRequest(problem, content_type="text/plain; charset=utf-8")
        return super().changelist_view(request, extra_context)

    # -- declarations that would defeat the masking ------------------------------------

    def check(self, **kwargs):
        errors = super().check(**kwargs)
        secret = set(self.secret_fields)
        where = {
            "list_filter": [f if isinstance(f, str) else f[0] for f in self.list_filter
                            if isinstance(f, (str, tuple, list))],
            "search_fields": [s.lstrip("^=@") for s in self.search_fields],
            "ordering": [o.lstrip("-") for o in self.ordering or () if isinstance(o, str)],
            "date_hierarchy": [self.date_hierarchy] if self.date_hierarchy else [],
        }
        for option, paths in where.items():
            for path in paths:
                if path.split("__")[0] in secret:
                    errors.append(checks.Error(
                        f"{option} names the secret field {path!r}; it would reveal it",
                        obj=self.__class__, id="gpumarket.E101"))
        return errors


class StrictTabularInline(SealedFieldsMixin, admin.TabularInline):
    """A read-only tabular inline with the same masking."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(StrictAdmin):
    """Rows change only through the services (append-only ledger, the market's locks)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
