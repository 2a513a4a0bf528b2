"""Forms of the pages. They only parse and check shapes (money as decimal USD strings,
whole numbers); every rule of the market is the service's, whose MarketError /
ProviderError / SettlementError the views attach to the field it names."""

from __future__ import annotations

import shlex

from django import forms
from django.contrib.auth.forms import UserCreationForm

from marketplace.models import Auction, Order
from settlement.money import MoneyFormatError, parse_usd

MAX_HOURS = 366 * 24
MAX_GPUS = 4096


class UsdField(forms.CharField):
    """A decimal USD string ("2.49", at most 6 places) → integer micro-USD."""

    def __init__(self, *, positive: bool = True, **kwargs):
        self.positive = positive
        kwargs.setdefault("widget", forms.TextInput(attrs={
            "inputmode": "decimal", "autocomplete": "off", "maxlength": "24",
            "title": 'USD with at most 6 decimals, such as "2.49"'}))
        super().__init__(**kwargs)

    def to_python(self, value):
        value = super().to_python(value)
        if value in self.empty_values:
            return None
        if len(value) > 24:
            raise forms.ValidationError("must be at most 24 characters")
        try:
            micros = parse_usd(value)
        except MoneyFormatError as exc:
            raise forms.ValidationError(str(exc)) from None
        if self.positive and micros <= 0:
            raise forms.ValidationError("must be greater than zero")
        return micros


class CommandField(forms.CharField):
    """A command line, split like a shell would (no shell runs it) → list of strings."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.validators = []  # the length is checked on the text, not on the word list

    def to_python(self, value):
        value = super().to_python(value)
        if not value:
            return None
        if len(value) > 4000:
            raise forms.ValidationError("must be at most 4000 characters")
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise forms.ValidationError(f"cannot be split into words: {exc}") from None
        if len(parts) > 64:
            raise forms.ValidationError("at most 64 words")
        return parts or None


class PortsField(forms.CharField):
    """Container TCP ports to expose, comma- or space-separated ("8888, 6006") → sorted list
    of distinct ints 1–65535, at most 8; empty → []."""

    def to_python(self, value):
        value = super().to_python(value) or ""
        words = [w for w in value.replace(",", " ").split() if w]
        if len(words) > 8:
            raise forms.ValidationError("at most 8 ports")
        ports = []
        for word in words:
            if not word.isdigit() or not 1 <= int(word) <= 65535:
                raise forms.ValidationError(f"{word!r} is not a TCP port (1 to 65535)")
            ports.append(int(word))
        if len(set(ports)) != len(ports):
            raise forms.ValidationError("lists a port twice")
        return sorted(ports)


def _ports() -> PortsField:
    return PortsField(label="Ports to expose", max_length=100, required=False,
                      help_text="optional container TCP ports, e.g. 8888 (at most 8); the "
                                "lease shows where to connect once it runs")


def _int(label: str, *, min_value: int = 1, max_value: int = MAX_GPUS, required: bool = True,
         help_text: str = "", initial=None) -> forms.IntegerField:
    return forms.IntegerField(label=label, min_value=min_value, max_value=max_value,
                              required=required, help_text=help_text, initial=initial)


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        fields = ("username",)


class DevCreditForm(forms.Form):
    amount = UsdField(label="Amount (USD)", help_text="development credit, at most 1000000 USD")

    def clean_amount(self):
        amount = self.cleaned_data["amount"]
        if amount > 1_000_000 * 1_000_000:
            raise forms.ValidationError("at most 1000000 USD per credit")
        return amount


class TopUpForm(forms.Form):
    amount = UsdField(label="Amount (USD)", help_text="whole cents, such as 25.00")

    def clean_amount(self):
        amount = self.cleaned_data["amount"]
        if amount % 10_000:
            raise forms.ValidationError('must be whole cents, such as "25.00"')
        return amount


class BidForm(forms.Form):
    gpus = _int("GPUs", initial=1)
    hours = _int("Hours", max_value=MAX_HOURS, initial=1)
    price = UsdField(label="Limit price (USD per GPU-hour)")
    gang_size = _int("GPUs per node (gang size)", required=False,
                     help_text="empty: all GPUs on one node")
    time_in_force = forms.ChoiceField(label="Time in force",
                                      choices=[(v, v) for v in Order.TimeInForce.values],
                                      initial="GTC")
    image = forms.CharField(label="Container image", max_length=255, required=False,
                            initial="gpumarket/busybox:local")
    command = CommandField(label="Command", max_length=4000, required=False,
                           help_text="optional; empty runs the image's own command")
    ports = _ports()

    def clean(self):
        data = super().clean()
        gpus, gang = data.get("gpus"), data.get("gang_size")
        if gpus and gang and gpus % gang:
            self.add_error("gang_size", f"must divide GPUs ({gpus})")
        return data


class SealedBidForm(forms.Form):
    price = UsdField(label="Your price (USD per GPU-hour)")
    gpus = _int("GPUs", required=False, help_text="empty: the whole lot")
    min_gpus = _int("At least (GPUs)", required=False,
                    help_text="multi-unit rules: the fewest GPUs you accept")
    image = forms.CharField(label="Container image", max_length=255, required=False,
                            initial="gpumarket/busybox:local")
    command = CommandField(label="Command", max_length=4000, required=False)
    ports = _ports()


class ProviderForm(forms.Form):
    display_name = forms.CharField(label="Provider name", max_length=100)


class PayoutAddressForm(forms.Form):
    address = forms.RegexField(label="Wallet address for on-chain payouts (0x…)",
                               regex=r"^0x[0-9a-fA-F]{40}$", max_length=42,
                               error_messages={"invalid": "must be 0x and 40 hex digits"})


class NodeForm(forms.Form):
    name = forms.CharField(label="Node name", max_length=100)


class RotateTokenForm(forms.Form):
    """The node page's "Rotate runner token": the box is the confirmation."""

    confirm = forms.BooleanField(
        label="I understand: the current token stops working at once, and this node's "
              "runner needs the new one",
        error_messages={"required": "tick the box to confirm: the current runner token "
                                    "stops working at once"})


class _NodeChoice(forms.Form):
    def __init__(self, *args, nodes=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["node"].choices = [(n.pk, n.name) for n in nodes]


class AskForm(_NodeChoice):
    node = forms.TypedChoiceField(label="Node", coerce=int)
    gpus = _int("GPUs offered")
    price = UsdField(label="Ask price (USD per GPU-hour)")
    available_hours = _int("Available for (hours from now)", max_value=MAX_HOURS, initial=24)


class AuctionForm(_NodeChoice):
    node = forms.TypedChoiceField(label="Node", coerce=int)
    gpus = _int("GPUs in the lot")
    reserve_price = UsdField(label="Reserve price (USD per GPU-hour)")
    hours = _int("Lease length (hours)", max_value=MAX_HOURS, initial=1)
    rule = forms.ChoiceField(label="Rule",
                             choices=[(v, v.replace("_", " ")) for v in Auction.Rule.values],
                             initial="second_price")
    closes_in_minutes = _int("Closes in (minutes)", max_value=60 * 24 * 30, initial=10)
