"""The webhooks page (/webhooks/): your endpoints with their delivery log, a form to add
one (the answer shows its signing secret once, never again: no redirect carries it), a
"Send test event" and a Delete button each (POST, then back: PRG); and your alert rules
with their latest incidents, a form to add one, Delete. Through webhooks/services.py and
alerts/services.py, as the API; a refusal is shown next to the field it names (400)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from alerts import rules
from alerts import services as alert_services
from alerts.models import AlertRule
from frontend.views import _page, _service_error, member
from marketplace.errors import MarketError
from webhooks import services, targets
from webhooks.events import EVENT_TYPES
from webhooks.models import WebhookEndpoint

LOG_ROWS = 20


class WebhookForm(forms.Form):
    url = forms.CharField(label="URL", max_length=targets.MAX_URL_CHARS, strip=False,
                          help_text="http(s), on a public address; we POST signed JSON to it",
                          widget=forms.URLInput(attrs={"placeholder": "https://example.com/hooks"}))
    events = forms.MultipleChoiceField(
        label="Events", widget=forms.CheckboxSelectMultiple,
        choices=[(t, f"{t} — {EVENT_TYPES[t]}") for t in services.SUBSCRIBABLE])


class AlertRuleForm(forms.Form):
    name = forms.CharField(label="Name", max_length=100, required=False)
    expression = forms.CharField(
        label="Rule", max_length=rules.MAX_CHARS, strip=False,
        help_text="e.g. gpu_utilization < 5% FOR 30m AND lease_cost > 50 USD; metrics: "
                  + ", ".join(rules.METRICS))


def _context(request, form=None, rule_form=None, **extra) -> dict:
    endpoints = list(WebhookEndpoint.objects.filter(user=request.user))
    for endpoint in endpoints:
        endpoint.log = list(endpoint.deliveries.select_related("event")[:LOG_ROWS])
    alert_rules = list(AlertRule.objects.filter(user=request.user))
    for rule in alert_rules:
        rule.latest = list(rule.incidents.all()[:5])
    return {"endpoints": endpoints, "form": form or WebhookForm(), "alert_rules": alert_rules,
            "rule_form": rule_form or AlertRuleForm(), **extra}


@member
def webhooks_page(request):
    return _page(request, "frontend/webhooks.html", _context(request))


@member
@require_POST
def webhook_add(request):
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            endpoint, secret = services.create_endpoint(user_id=request.user.pk,
                                                        **form.cleaned_data)
        except MarketError as exc:
            _service_error(form, exc)
        else:  # rendered, not redirected: the secret goes into no URL or session
            return _page(request, "frontend/webhooks.html",
                         _context(request, created=endpoint, secret=secret), status=201)
    return _page(request, "frontend/webhooks.html", _context(request, form), status=400)


@member
@require_POST
def webhook_test(request, pk: int):
    try:
        event = services.send_test(user_id=request.user.pk, endpoint_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Test event {event.id} queued: it shows in the log below "
                                  "once the worker has sent it.")
    return redirect("webhooks-page")


@member
@require_POST
def webhook_delete(request, pk: int):
    try:
        services.delete_endpoint(user_id=request.user.pk, endpoint_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Webhook endpoint deleted.")
    return redirect("webhooks-page")


@member
@require_POST
def alert_rule_add(request):
    form = AlertRuleForm(request.POST)
    if form.is_valid():
        try:
            alert_services.create_rule(user_id=request.user.pk, **form.cleaned_data)
        except MarketError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, "Alert rule added: the worker evaluates it every few "
                                      "seconds.")
            return redirect("webhooks-page")
    return _page(request, "frontend/webhooks.html", _context(request, rule_form=form),
                 status=400)


@member
@require_POST
def alert_rule_delete(request, pk: int):
    try:
        alert_services.delete_rule(user_id=request.user.pk, rule_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Alert rule deleted.")
    return redirect("webhooks-page")
