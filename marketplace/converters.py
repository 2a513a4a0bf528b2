"""The `gpuclass` URL converter: a GPU class slug, a MIG slice market's included
("h100-sxm-80gb.1g.10gb": Django's `slug` converter refuses the dots). Registered once, on
import, for the API, the pages and the market feed's websocket route."""

from django.urls import register_converter


class GpuClassSlug:
    regex = r"[-a-zA-Z0-9_]+(?:\.[-a-zA-Z0-9_]+)*"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(GpuClassSlug, "gpuclass")
