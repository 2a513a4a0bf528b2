"""The API reads JSON only. DRF's JSONParser lets a RecursionError (a body nested a few
thousand levels deep) escape as a 500; this one answers 400 like any malformed body."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
