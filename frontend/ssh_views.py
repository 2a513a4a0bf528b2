"""The wallet page's SSH keys section: add one (POST, then back to the wallet: PRG) or
delete one, through marketplace/ssh_keys.py as the API does; a refused key is shown next
to the field it names, with the wallet page answered 400."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from frontend import forms as f
from frontend.views import _page, _service_error, _wallet_context, member
from marketplace import ssh_keys
from marketplace.errors import MarketError


@member
@require_POST
def ssh_key_add(request):
    form = f.SshKeyForm(request.POST)
    if form.is_valid():
        try:
            key = ssh_keys.add_key(owner_id=request.user.pk,
                                   public_key=form.cleaned_data["public_key"],
                                   name=form.cleaned_data.get("name"))
        except MarketError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, f"SSH key “{key.name}” added ({key.fingerprint}).")
            return redirect("wallet-page")
    return _page(request, "frontend/wallet.html",
                 _wallet_context(request, ssh_key_form=form), status=400)


@member
@require_POST
def ssh_key_delete(request, pk: int):
    try:
        ssh_keys.delete_key(owner_id=request.user.pk, key_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "SSH key deleted: your next leases no longer get it.")
    return redirect("wallet-page")
