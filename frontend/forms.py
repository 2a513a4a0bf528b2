"""Forms of the pages. Each field that the API also takes is the API's own field
(forms_fields.ApiField: the serializer's field and its `validate_<name>`), so a page and
the API refuse the same values with the same messages; the forms only turn the page's text
into the API's shapes (whole numbers, word and port lists). Every rule of the market is the
service's, whose MarketError / ProviderError / SettlementError the views attach to the
field it names."""

from __future__ import annotations

from django import forms
from django.contrib.auth.forms import UserCreationForm

from frontend.forms_fields import (
    ApiField,
    WriteOnlyTextarea,
    name_value_lines,
    port_list,
    whole_number,
    words,
)
from frontend.forms_terms import BidTerms, term_fields
from marketplace.api.accounts import SignupIn
from marketplace.api.auction_serializers import AuctionInSerializer, SealedBidInSerializer
from marketplace.api.serializers import LeaseExtendInSerializer, OrderInSerializer
from marketplace.api.ssh_keys import SshKeyIn
from marketplace.book import NVLINK_GANG_OF_ONE
from marketplace.env_templates import CUSTOM, TEMPLATES
from marketplace.models import Auction, Interconnect, Order
from providers.api import NodeCreateIn, NodePatchIn, ProviderIn
from settlement.api import ChainAddressIn, DevCreditIn, TopUpIn

_USD_INPUT = {"inputmode": "decimal", "autocomplete": "off", "maxlength": "24",
              "title": 'USD with at most 6 decimals, such as "2.49"'}


def _usd(serializer, name: str, label: str, **kwargs) -> ApiField:
    """A price or amount: a decimal USD string ("2.49", at most 6 places) → micro-USD."""
    return ApiField(serializer, name, label=label, widget=forms.TextInput(attrs=_USD_INPUT),
                    **kwargs)


def _whole(serializer, name: str, label: str, **kwargs) -> ApiField:
    return ApiField(serializer, name, label=label, to_json=whole_number, **kwargs)


def _image(serializer) -> ApiField:
    return ApiField(serializer, "image", label="Own image (or the template's, overridden)",
                    help_text="with a template: empty runs the template's image; without "
                              "one: e.g. gpumarket/busybox:local (empty: the default image)")


def template_choices() -> list[tuple[str, str]]:
    """The template select: each template (with its CUDA need), then "own image"."""
    rows = [(t.id, f"{t.title}" + (f" — needs CUDA {t.min_cuda}" if t.min_cuda else ""))
            for t in TEMPLATES.values() if t.id != CUSTOM]
    return [*rows, ("", "Own image (the fields below)")]


def _template(serializer) -> ApiField:
    """The environment template (marketplace/templates.json) or "" for own image."""
    return ApiField(serializer, "template", label="Template", initial="",
                    widget=forms.Select(choices=template_choices()),
                    help_text="its image, command, ports (SSH, Jupyter, HTTP) and CUDA need; "
                              "a field below overrides it")


def _min_cuda(serializer) -> ApiField:
    return ApiField(serializer, "min_cuda", label="Minimum CUDA version",
                    help_text='optional, e.g. "12.4": only nodes whose driver supports it '
                              "(empty: the template's)")


def _yes_no(text: str):
    return {"yes": True, "no": False}.get(text, text)


def _ssh(serializer) -> ApiField:
    return ApiField(serializer, "ssh", label="SSH access", to_json=_yes_no,
                    widget=forms.Select(choices=[("", "as the template says"),
                                                 ("yes", "yes: my SSH keys, port 22"),
                                                 ("no", "no")]))


def _command(serializer, **kwargs) -> ApiField:
    """A command line, split like a shell would (no shell runs it) → list of strings."""
    return ApiField(serializer, "command", label="Command", to_json=words, **kwargs)


COMMAND_HELP = ("empty runs the template's command, or else the image's own — on a node "
                "with Docker only: a node that runs local processes (--runtime process) "
                "needs a command")


class _CommandHelp:
    """`images`: whether the nodes the form's bid may land on run images (runtimes.py);
    False: the help says a command is needed here (the service refuses the bid without)."""

    def __init__(self, *args, images: bool = True, where: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        if not images:
            self.fields["command"].help_text = (
                f"needed: {where} runs workloads as local processes (--runtime process), "
                "which cannot run an image's own command")


def _ports(serializer) -> ApiField:
    """Container TCP ports to expose, comma- or space-separated ("8888, 6006")."""
    return ApiField(serializer, "ports", label="Ports to expose", to_json=port_list,
                    widget=forms.TextInput(attrs={"maxlength": "100"}),
                    help_text="optional container TCP ports, e.g. 8888 (at most 8); the "
                              "lease shows where to connect once it runs")


_VARS = {"rows": 3, "spellcheck": "false", "autocomplete": "off"}


def _env(serializer) -> ApiField:
    """Environment variables, one NAME=VALUE a line → {NAME: VALUE} (the API's `env`)."""
    return ApiField(serializer, "env", label="Environment variables",
                    to_json=name_value_lines, widget=forms.Textarea(attrs=_VARS),
                    help_text="optional, one NAME=VALUE a line, e.g. EPOCHS=3 (shown on "
                              "the lease)")


def _secrets(serializer) -> ApiField:
    """Secrets, one NAME=VALUE a line (the API's write-only `secrets`): never rendered
    back into the page, also not when the form is shown again after an error."""
    return ApiField(serializer, "secrets", label="Secrets", to_json=name_value_lines,
                    widget=WriteOnlyTextarea(attrs=_VARS),
                    help_text="optional, one NAME=VALUE a line, e.g. HF_TOKEN=hf_…; sealed, "
                              "given only to the lease's container, shown by name only "
                              "(after an error, enter them again)")


class SignupForm(UserCreationForm):
    username = ApiField(SignupIn, "username", label="Username",
                        help_text="3 to 150 of A–Z a–z 0–9 _ . @ + -")

    class Meta(UserCreationForm.Meta):
        fields = ("username",)


class DevCreditForm(forms.Form):
    amount = _usd(DevCreditIn, "amount", "Amount (USD)",
                  help_text="development credit, at most 1000000 USD")


class SshKeyForm(forms.Form):
    """Add an SSH public key (marketplace/ssh_keys.py checks it, as for the API)."""

    name = ApiField(SshKeyIn, "name", label="Name", help_text="e.g. laptop (default: the "
                    "key's comment)", widget=forms.TextInput(attrs={"maxlength": "100"}))
    public_key = ApiField(SshKeyIn, "public_key", label="Public key", required=True,
                          widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                          help_text="one line from your .pub file: ssh-ed25519 AAAA… "
                                    "(ed25519, ECDSA or RSA ≥ 2048 bits)")


class TopUpForm(forms.Form):
    amount = _usd(TopUpIn, "amount", "Amount (USD)", help_text="whole cents, such as 25.00")


_BidTermsForm = type("_BidTermsForm", (BidTerms, forms.Form), term_fields(
    OrderInSerializer, failover_default="default: yes"))
_SealedTermsForm = type("_SealedTermsForm", (BidTerms, forms.Form), term_fields(
    SealedBidInSerializer, failover_default="default: yes"))


class BidForm(_CommandHelp, _BidTermsForm):
    template = _template(OrderInSerializer)
    gpus = _whole(OrderInSerializer, "gpus", "GPUs", initial=1)
    hours = _whole(OrderInSerializer, "hours", "Hours", required=True, initial=1)
    price = _usd(OrderInSerializer, "price", "Limit price (USD per GPU-hour)")
    gang_size = _whole(OrderInSerializer, "gang_size", "GPUs per node (gang size)",
                       help_text="empty: all GPUs on one node")
    time_in_force = ApiField(OrderInSerializer, "time_in_force", label="Time in force",
                             initial="GTC", widget=forms.Select(
                                 choices=[(v, v) for v in Order.TimeInForce.values]))
    image = _image(OrderInSerializer)
    command = _command(OrderInSerializer, help_text=COMMAND_HELP)
    ports = _ports(OrderInSerializer)
    env = _env(OrderInSerializer)
    secrets = _secrets(OrderInSerializer)
    min_cuda = _min_cuda(OrderInSerializer)
    ssh = _ssh(OrderInSerializer)
    interconnect = ApiField(OrderInSerializer, "interconnect", label="Interconnect",
                            initial="any", help_text="nvlink: each gang's GPUs all "
                            "NVLink-connected", widget=forms.Select(
                                choices=[(v, v) for v in Interconnect.values]))
    node = _whole(OrderInSerializer, "node", "Only on node (id)",
                  help_text="empty: any node; an offer's \u201cBid for this node\u201d sets it")

    def clean(self):
        data = super().clean()
        gpus, gang = data.get("gpus"), data.get("gang_size")
        if gpus and gang and gpus % gang:
            self.add_error("gang_size", "must divide gpus")  # as OrderInSerializer.validate
        if data.get("interconnect") == Interconnect.NVLINK and (gang or gpus) == 1:
            self.add_error("interconnect", NVLINK_GANG_OF_ONE)
        return data


class SealedBidForm(_CommandHelp, _SealedTermsForm):
    template = _template(SealedBidInSerializer)
    price = _usd(SealedBidInSerializer, "price", "Your price (USD per GPU-hour)")
    gpus = _whole(SealedBidInSerializer, "gpus", "GPUs", help_text="empty: the whole lot")
    min_gpus = _whole(SealedBidInSerializer, "min_gpus", "At least (GPUs)",
                      help_text="multi-unit rules: the fewest GPUs you accept")
    image = _image(SealedBidInSerializer)
    command = _command(SealedBidInSerializer, help_text=COMMAND_HELP)
    ports = _ports(SealedBidInSerializer)
    env = _env(SealedBidInSerializer)
    secrets = _secrets(SealedBidInSerializer)
    min_cuda = _min_cuda(SealedBidInSerializer)
    ssh = _ssh(SealedBidInSerializer)
    interconnect = ApiField(SealedBidInSerializer, "interconnect", label="Interconnect",
                            initial="any", help_text="nvlink: the GPUs you win all "
                            "NVLink-connected", widget=forms.Select(
                                choices=[(v, v) for v in Interconnect.values]))


class ProviderForm(forms.Form):
    display_name = ApiField(ProviderIn, "display_name", label="Provider name")


class PayoutAddressForm(forms.Form):
    # the format is checked by settlement.onchain.address_register, for both
    address = ApiField(ChainAddressIn, "address",
                       label="Wallet address for on-chain payouts (0x…)")


class NodeForm(forms.Form):
    name = ApiField(NodeCreateIn, "name", label="Node name")


class RenameNodeForm(forms.Form):
    name = ApiField(NodePatchIn, "name", label="New name")


class RetireNodeForm(forms.Form):
    """The node page's "Retire node": the box is the confirmation."""

    confirm = forms.BooleanField(
        label="I understand: its asks are cancelled, its runner token stops working, and "
              "it is listed nowhere any more (its leases and earnings stay)",
        error_messages={"required": "tick the box to confirm: a retired node cannot be "
                                    "brought back"})


class RotateTokenForm(forms.Form):
    """The node page's "Rotate runner token": the box is the confirmation."""

    confirm = forms.BooleanField(
        label="I understand: the current token stops working at once, and this node's "
              "runner needs the new one",
        error_messages={"required": "tick the box to confirm: the current runner token "
                                    "stops working at once"})


class MaintenanceForm(forms.Form):
    """The node page's "Announce maintenance": the window's start and end (UTC) and an
    optional reason; the service (marketplace/maintenance.py) checks them."""

    starts_at = forms.DateTimeField(label="From (UTC)", widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    ends_at = forms.DateTimeField(label="Until (UTC)", widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    reason = forms.CharField(label="Reason (shown to the buyers of leases it ends)",
                             max_length=200, required=False)


class _NodeChoice(forms.Form):
    def __init__(self, *args, nodes=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["node"].choices = [(n.pk, n.name) for n in nodes]


class AskForm(_NodeChoice):
    node = forms.TypedChoiceField(label="Node", coerce=int)
    gpus = _whole(OrderInSerializer, "gpus", "GPUs offered")
    price = _usd(OrderInSerializer, "price", "Ask price (USD per GPU-hour)")
    # the API takes available_until; the page, hours from now (the API's bounds of hours)
    available_hours = _whole(OrderInSerializer, "hours", "Available for (hours from now)",
                             required=True, initial=24)


class AuctionForm(_NodeChoice):
    node = forms.TypedChoiceField(label="Node", coerce=int)
    gpus = _whole(AuctionInSerializer, "gpus", "GPUs in the lot")
    reserve_price = _usd(AuctionInSerializer, "reserve_price",
                         "Reserve price (USD per GPU-hour)")
    hours = _whole(AuctionInSerializer, "hours", "Lease length (hours)", required=True,
                   initial=1)
    rule = ApiField(AuctionInSerializer, "rule", label="Rule", initial="second_price",
                    widget=forms.Select(choices=[(v, v.replace("_", " "))
                                                 for v in Auction.Rule.values]))
    # the API takes closes_at; the page, minutes from now
    closes_in_minutes = forms.IntegerField(label="Closes in (minutes)", min_value=1,
                                           max_value=60 * 24 * 30, initial=10)



class ExtendLeaseForm(forms.Form):
    """The leases page's "Extend": whole hours more (the API's `hours`), and the page's own
    `request_id` (hidden; new on each GET) so that a form sent twice extends once."""

    hours = _whole(LeaseExtendInSerializer, "hours", "Hours more", required=True, initial=1)
    request_id = ApiField(LeaseExtendInSerializer, "request_id", required=False,
                          widget=forms.HiddenInput)
