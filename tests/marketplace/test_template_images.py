"""GPUMARKET_TEMPLATE_IMAGES (marketplace/template_images.py): an operator's image per
template, as JSON or id=image pairs; a bad value stops the start with one line naming
it; the mapped image is what the API lists and what a template bid gets."""

from __future__ import annotations

import pytest

from marketplace.env_templates import TEMPLATES, resolve
from marketplace.models import Order
from marketplace.template_images import parse_template_images
from tests.factories import bid_body, funded_buyer
from tests.support.api import client_for
from tests.test_deploy_settings import _django

MIRROR = "mirror.example:5000/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def test_json_and_pairs_give_the_same_mapping():
    want = {"pytorch-jupyter": "gpumarket/jupyter:local", "cuda-ssh": "gpumarket/sshd:local"}
    assert parse_template_images(
        '{"pytorch-jupyter": "gpumarket/jupyter:local", "cuda-ssh": "gpumarket/sshd:local"}'
    ) == want
    assert parse_template_images(
        "pytorch-jupyter=gpumarket/jupyter:local, cuda-ssh=gpumarket/sshd:local") == want
    assert parse_template_images("") == {} and parse_template_images("  ") == {}


@pytest.mark.parametrize(("raw", "says"), [
    ("pytorch-jupiter=gpumarket/jupyter:local", "unknown template 'pytorch-jupiter': known "
                                                "templates are cuda-ssh, custom, "),
    ("custom=gpumarket/busybox:local", "template custom has no image to replace"),
    ("vllm=Not/An/Image", "vllm: image 'Not/An/Image' must be a Docker image reference"),
    ("vllm=", "vllm: image '' must be a Docker image reference"),
    ("vllm", "entry 'vllm' is not id=image"),
    ('{"vllm": "a:1", "vllm": "b:2"}', "template vllm is given twice"),
    ('{"vllm": 3}', "vllm: the image must be a string"),
    ("vllm=10.0.0.5:5000/vllm:1", "vllm: image '10.0.0.5:5000/vllm:1' must not name a "
                                  "registry at a private or loopback address (registry "
                                  "10.0.0.5 is a private address)"),
    ('{"vllm": ', "is not valid JSON"),
    ('{"vllm": "a" ]', "is not valid JSON"),
])
def test_a_bad_value_is_refused_naming_the_entry(raw, says):
    with pytest.raises(ValueError) as caught:
        parse_template_images(raw)
    assert says in str(caught.value)


def test_a_private_registry_is_taken_when_the_setting_allows_it():
    assert parse_template_images("vllm=127.0.0.1:5000/vllm:1", allow_private_registry=True
                                 ) == {"vllm": "127.0.0.1:5000/vllm:1"}


def test_a_bad_value_stops_the_start_in_one_line(tmp_path):
    done = _django(tmp_path, "manage.py", "check",
                   GPUMARKET_TEMPLATE_IMAGES="pytorch-jupiter=gpumarket/jupyter:local")
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "GPUMARKET_TEMPLATE_IMAGES: unknown template 'pytorch-jupiter'" in line, line
    good = _django(tmp_path, "-c", "import django; django.setup(); from django.conf import "
                   "settings as s; print(s.GPUMARKET_TEMPLATE_IMAGES)",
                   GPUMARKET_TEMPLATE_IMAGES=f'{{"pytorch-jupyter": "{MIRROR}"}}')
    assert good.stdout.strip() == repr({"pytorch-jupyter": MIRROR}), good.stderr


@pytest.mark.django_db
def test_the_mapped_image_is_listed_and_taken_by_a_template_bid(settings):
    settings.GPUMARKET_TEMPLATE_IMAGES = {"pytorch-jupyter": MIRROR}
    listed = {t["id"]: t for t in client_for().get("/api/v1/templates/").json()["results"]}
    assert listed["pytorch-jupyter"]["image"] == MIRROR
    assert listed["vllm"]["image"] == TEMPLATES["vllm"].image  # not mapped: its own
    assert TEMPLATES["pytorch-jupyter"].image != MIRROR  # the data itself is unchanged

    terms = resolve(template="pytorch-jupyter")
    assert terms["image"] == MIRROR and terms["min_cuda"] == "12.4"
    buyer = funded_buyer(10, ssh_key=True)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=1, template="pytorch-jupyter"),
                               format="json")
    assert r.status_code == 201, r.json()
    assert Order.objects.get(pk=r.json()["id"]).image == MIRROR
