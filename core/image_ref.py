"""Docker image references: the grammar (a plain regular expression, no Django), used by
the API's image field and by settings (GPUMARKET_TEMPLATE_IMAGES). The refusal of
registries at private or loopback addresses is the runner's rule
(providers/runner/registry_host.py), applied by marketplace/template_images.py and the
API's image field."""

from __future__ import annotations

import re

# Docker's image reference grammar, as github.com/distribution/reference (v0.5.0,
# reference.go and regexp.go) defines it — the grammar the Docker Engine parses `image`
# with:
#   reference        := name [ ":" tag ] [ "@" digest ]
#   name             := [domain '/'] remote-name
#   domain           := host [':' port-number]
#   host             := domain-name | IPv4address | \[ IPv6address \]
#   domain-name      := domain-component ['.' domain-component]*
#   domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
#   port-number      := /[0-9]+/
#   path-component   := alpha-numeric [separator alpha-numeric]*
#   remote-name      := path-component ['/' path-component]*
#   alpha-numeric    := /[a-z0-9]+/
#   separator        := /[_.]|__|[-]+/
#   tag              := /[\w][\w.-]{0,127}/
#   digest           := digest-algorithm ":" digest-hex
#   digest-algorithm := component [ /[+.-_]/ component ]*, component := /[A-Za-z][A-Za-z0-9]*/
#   digest-hex       := /[0-9a-fA-F]{32,}/
# and a name of at most 255 characters (NameTotalLengthMax).
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)
IMAGE_NAME_MAX = 255


def image_reference_problem(value: str) -> str | None:
    """Why `value` is not an image reference Docker accepts, or None when it is one."""
    match = IMAGE_REFERENCE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return ("must be a Docker image reference, name[:tag][@digest], such as "
                "\"gpumarket/busybox:local\" (lowercase repository names)")
    if len(match.group("name")) > IMAGE_NAME_MAX or len(value) > IMAGE_NAME_MAX:
        return f"is longer than {IMAGE_NAME_MAX} characters"
    return None

