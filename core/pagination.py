"""The one pagination of every API list: `{count, next, previous, results}` with strict
`?limit=` and `?offset=` (anything else is a 400 naming the parameter). A list takes no
other query parameter but the filters its view names (`query_filters`), each once: an
unknown or repeated one is a 400 naming it, never silently ignored."""

from __future__ import annotations

import re

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_OFFSET = 10**18 - 1  # what 18 digits hold; beyond any list
_DIGITS = re.compile(r"[0-9]{1,18}")


def _query_whole(request, name: str, *, low: int, high: int | None, says: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    value = int(raw) if _DIGITS.fullmatch(raw) else None
    if value is None or value < low or (high is not None and value > high):
        raise serializers.ValidationError({name: [says]})
    return value


class Pagination(LimitOffsetPagination):
    """The one pagination of every API list: `{count, next, previous, results}`,
    `?limit=` (1 to MAX_LIMIT, default DEFAULT_LIMIT) and `?offset=` (0 to MAX_OFFSET). A limit
    or offset that is not such a whole number is a 400 naming the parameter (DRF's
    LimitOffsetPagination would silently use its default instead)."""

    default_limit = DEFAULT_LIMIT
    max_limit = MAX_LIMIT

    def paginate_queryset(self, queryset, request, view=None):
        # every parameter checked before anything is read
        known = (self.limit_query_param, self.offset_query_param,
                 *getattr(view, "query_filters", ()))
        for name in request.query_params:
            if name not in known:
                takes = ", ".join(known)
                raise serializers.ValidationError(
                    {name: [f"is not a parameter of this list (it takes {takes})"]})
            if len(request.query_params.getlist(name)) > 1:
                raise serializers.ValidationError({name: ["is given more than once"]})
        self._limit = _query_whole(request, self.limit_query_param, low=1, high=MAX_LIMIT,
                                   says=f"must be a whole number from 1 to {MAX_LIMIT}")
        self._offset = _query_whole(request, self.offset_query_param, low=0, high=MAX_OFFSET,
                                    says=f"must be a whole number from 0 to {MAX_OFFSET}")
        return super().paginate_queryset(queryset, request, view)

    def get_limit(self, request):
        return self.default_limit if self._limit is None else self._limit

    def get_offset(self, request):
        return self._offset or 0

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for p in parameters:
            if p["name"] == self.limit_query_param:
                p["schema"].update(minimum=1, maximum=MAX_LIMIT, default=DEFAULT_LIMIT)
                p["description"] = (f"how many results, 1 to {MAX_LIMIT} (default "
                                    f"{DEFAULT_LIMIT}); anything else is a 400")
            elif p["name"] == self.offset_query_param:
                p["schema"].update(minimum=0, maximum=MAX_OFFSET, default=0)
                p["description"] = (f"how many results to skip, 0 to {MAX_OFFSET}; anything "
                                    "else is a 400")
        return parameters


def paginated(view, request, queryset, serializer_class, *, context=None):
    """The list answer {count, next, previous, results} of `queryset` (Pagination)."""
    paginator = Pagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(
        serializer_class(page, many=True, context=context or {}).data)
