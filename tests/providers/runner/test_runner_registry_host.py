"""Which registry an image reference names and whether it is private or loopback
(providers/runner/registry_host.py; docs/IMAGES.md "Private registries"): Docker's rule
for the registry component, IP literals in every form the resolver reads, no DNS."""

from __future__ import annotations

import pytest

from providers.runner.cli import build_parser
from providers.runner.registry_host import private_registry_problem, registry_host


@pytest.mark.parametrize(("ref", "host"), [
    ("busybox", None), ("pytorch/pytorch:2", None), ("127/app", None),  # Docker Hub
    ("127.0.0.1:5000/a/b:1", "127.0.0.1"), ("[::1]:5000/x:1", "::1"),
    ("localhost/x", "localhost"), ("LocalHost:1/x", "LocalHost"),
    ("registry.example:5000/a@sha256:" + "0" * 64, "registry.example"),
])
def test_the_registry_host_is_dockers_first_component(ref, host):
    assert registry_host(ref) == host


@pytest.mark.parametrize(("ref", "kind"), [
    ("127.0.0.1:22/x:1", "registry 127.0.0.1 is a loopback address"),
    ("[::1]:5000/x:1", "registry ::1 is a loopback address"),
    ("10.0.0.5:5000/x:1", "registry 10.0.0.5 is a private address"),
    ("localhost:5000/x", "registry localhost is a loopback host"),
    ("dev.localhost/x", "registry dev.localhost is a loopback host"),
    ("169.254.169.254/x", "registry 169.254.169.254 is a link-local address"),
    ("0.0.0.0/x", "registry 0.0.0.0 is an unspecified address"),
    ("0:5000/x", "registry 0 is an unspecified address"),
    ("224.0.0.1/x", "registry 224.0.0.1 is a multicast address"),
    ("[fe80::1]/x", "registry fe80::1 is a link-local address"),
    ("[::ffff:7f00:1]/x", "registry ::ffff:7f00:1 is a loopback address"),  # IPv4-mapped
    ("127.1/x", "registry 127.1 is a loopback address"),  # inet_aton's short forms
    ("0x7f.1/x", "registry 0x7f.1 is a loopback address"),
    ("127.000.0.1/x", "registry 127.000.0.1 is a loopback address"),
    ("100.64.0.1/x", "registry 100.64.0.1 is a non-public address"),  # shared (CGNAT)
])
def test_private_loopback_and_other_non_public_registries_are_named(ref, kind):
    assert private_registry_problem(ref) == kind


@pytest.mark.parametrize("ref", [
    "busybox", "127/app", "8.8.8.8:5000/x", "[2606:4700::1111]/x", "nvcr.io/nvidia/x:1",
    "localhost.example/x", "internal-registry:5000/x",  # a host name: never resolved here
])
def test_hub_names_public_addresses_and_host_names_pass(ref):
    assert private_registry_problem(ref) is None


def test_the_runner_flag():
    assert build_parser().parse_args(["run"]).allow_private_registry is False
    assert build_parser().parse_args(["run", "--allow-private-registry"]
                                     ).allow_private_registry is True
