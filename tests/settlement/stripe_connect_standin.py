"""A small HTTP stand-in for the Stripe Connect endpoints localstripe lacks
(/v1/accounts, GET /v1/accounts/<id>, /v1/account_links, /v1/transfers), serving responses
recorded in the shape of Stripe's API reference (Account, AccountLink, Transfer objects and
its error object), and honouring Idempotency-Key like Stripe: the same key returns the first
response. It listens on 127.0.0.1 only. Used by tests/settlement/test_stripe_payouts.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

ACCOUNT = {  # Stripe API reference, "The Account object" (Express), trimmed
    "object": "account", "type": "express", "country": "US", "default_currency": "usd",
    "charges_enabled": False, "payouts_enabled": False, "details_submitted": False,
    "capabilities": {"transfers": "inactive"}, "metadata": {},
}
ACCOUNT_LINK = {"object": "account_link", "expires_at": 0, "url": ""}
TRANSFER = {  # "The Transfer object"
    "object": "transfer", "currency": "usd", "amount_reversed": 0, "reversed": False,
    "livemode": False, "metadata": {}, "source_type": "card",
}
INSUFFICIENT = {"error": {  # the error Stripe returns when the platform balance is short
    "type": "invalid_request_error", "code": "balance_insufficient",
    "message": "You have insufficient available funds in your Stripe account. Try adding "
               "funds directly to your available balance by creating Charges using the "
               "4000000000000077 test card.",
}}


class ConnectStandIn:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.by_key: dict[str, tuple[int, dict]] = {}
        self.fail_transfers = False      # answer 400 balance_insufficient
        self.drop_next_transfer = False  # close the connection without answering, once
        self.ids = itertools.count(1)
        self.accounts: dict[str, dict] = {}  # id → Account object (GET /v1/accounts/<id>)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                standin.requests.append({"path": self.path, "form": {}, "key": None,
                                         "method": "GET"})
                acct = standin.accounts.get(self.path.rsplit("/", 1)[-1])
                status, body = (200, acct) if self.path.startswith("/v1/accounts/") and acct \
                    else (404, {"error": {"type": "invalid_request_error",
                                          "message": f"No such account: {self.path}"}})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                key = self.headers.get("Idempotency-Key")
                standin.requests.append({"path": self.path, "form": form, "key": key})
                if self.path == "/v1/transfers" and standin.drop_next_transfer:
                    standin.drop_next_transfer = False
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if key and key in standin.by_key:
                    status, body = standin.by_key[key]
                else:
                    status, body = standin.answer(self.path, form)
                    if key:
                        standin.by_key[key] = (status, body)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path: str, form: dict) -> tuple[int, dict]:
        n = next(self.ids)
        now = int(time.time())
        if path == "/v1/accounts":
            acct = {**ACCOUNT, "id": f"acct_standin{n:08d}", "created": now}
            self.accounts[acct["id"]] = acct
            return 200, acct
        if path == "/v1/account_links":
            return 200, {**ACCOUNT_LINK, "created": now, "expires_at": now + 300,
                         "url": f"https://connect.stripe.com/setup/e/{form.get('account')}/x"}
        if path == "/v1/transfers":
            if self.fail_transfers:
                return 400, INSUFFICIENT
            return 200, {**TRANSFER, "id": f"tr_standin{n:08d}", "created": now,
                         "amount": int(form["amount"]), "destination": form["destination"],
                         "metadata": {k[9:-1]: v for k, v in form.items()
                                      if k.startswith("metadata[")}}
        return 404, {"error": {"type": "invalid_request_error",
                               "message": f"Unrecognized request URL (POST: {path})"}}

    def transfers(self) -> list[dict]:
        return [r for r in self.requests if r["path"] == "/v1/transfers"]
