"""SSH public keys on the buyer's account (/api/v1/ssh-keys/): ed25519, ECDSA and RSA ≥
2048 accepted with OpenSSH's own fingerprint; anything else a 400 naming public_key and
the problem, nothing written; a lease with `ssh` gets the buyer's keys of that moment
(runner payload `ssh_authorized_keys`), port 22 with role ssh, and its buyer — only its
buyer — sees `connect.ssh` once the runner reports the endpoint."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from frontend.feed import lease_payload
from marketplace import auctions
from marketplace.models import Lease, SshKey
from marketplace.ssh_keys import MAX_KEYS
from tests.factories import ask, ask_body, bid_body, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client
from tests.support.ssh import key_pair

pytestmark = pytest.mark.django_db
URL = "/api/v1/ssh-keys/"


def _ssh_keygen_fingerprint(line: str, tmp_path) -> str:
    path = tmp_path / "key.pub"
    path.write_text(line + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1]


@pytest.mark.parametrize(("kind", "key_type"), [
    ("ed25519", "ssh-ed25519"), ("ecdsa-256", "ecdsa-sha2-nistp256"),
    ("ecdsa-384", "ecdsa-sha2-nistp384"), ("ecdsa-521", "ecdsa-sha2-nistp521"),
    ("rsa-2048", "ssh-rsa")])
def test_an_accepted_key_is_listed_with_openssh_s_fingerprint(kind, key_type, tmp_path):
    buyer = funded_buyer(10)
    pair = key_pair(kind)
    r = client_for(buyer).post(URL, {"name": "laptop", "public_key": pair.public_line},
                               format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {"id", "name", "type", "fingerprint", "created_at"}
    assert body["type"] == key_type and body["name"] == "laptop"
    assert body["fingerprint"] == _ssh_keygen_fingerprint(pair.public_line, tmp_path)
    assert client_for(buyer).get(URL).json() == {"results": [body]}


def test_delete_is_204_then_404_and_another_user_s_key_is_404():
    buyer, other = funded_buyer(10), funded_buyer(10)
    key_id = client_for(buyer).post(URL, {"name": "a", "public_key": key_pair().public_line},
                                    format="json").json()["id"]
    assert client_for(other).delete(f"{URL}{key_id}/").status_code == 404
    assert client_for(other).get(URL).json() == {"results": []}
    assert SshKey.objects.filter(pk=key_id).exists()
    assert client_for(buyer).delete(f"{URL}{key_id}/").status_code == 204
    gone = client_for(buyer).delete(f"{URL}{key_id}/")
    assert gone.status_code == 404 and gone.json() == {"detail": f"you have no SSH key {key_id}"}
    assert client_for(buyer).get(URL).json() == {"results": []}


def test_the_name_defaults_to_the_key_s_comment():
    buyer = funded_buyer(10)
    r = client_for(buyer).post(URL, {"public_key": key_pair(comment="me@desk").public_line},
                               format="json")
    assert r.status_code == 201 and r.json()["name"] == "me@desk"


# a DSA key (1024 bits), made once: `cryptography` deprecates writing them
DSA_KEY = ("ssh-dss "
           "AAAAB3NzaC1kc3MAAACBALHkRzl+igU1uOIa9IzXf2z1oLyb/yGx46Nr2BxhAkNPOeDKSVvf/OAK"
           "U4pBFt17SyRrXCi+wFWYnJfnOZ0Szs1NlrzbRLY8qth7PgY4QfHM8curCB1a6WbAB8KleUCPSWSd"
           "GNfPA/Yjv17WkmVqPdO86zeEeMuoJO1z3bzZPWOHAAAAFQCeDdwt8DKaF5UIk/ETlKbDs9c4mwAA"
           "AIA2/InGPA2P0etppHqnziYsQ08SbXRZTXtK7JYXrt0OC4F8bnYzjIWMN7lGOrY4F3lqk/2a2fQq"
           "Qqt86cj/VqaeQWv7teVhnYnwhm3XLaTMQvPo7jfe5oPTa07MnnIc8cNBBs7Vva3skRXE0KVBMU3T"
           "QoSXxYpUh+279/rOWyzusAAAAIBU6bUJEOIGOilVgbSmvL35qjjzvJb7GqflVs2L9N6ScmA3ZFom"
           "mPTXds8AWPTjJZVqwN0jnQ+IuctqhvOP603KSnlBKHrFEdK8yXsmgFOjLOSIZEiHK+LkO8TVegsp"
           "MwZApGE0X9KXUOJX+TGIllPwshciVAhckMj/BHLwyt/LJA=="
           " old@box")


def _private_pem() -> str:
    return key_pair().private_openssh()


REFUSED = {
    "dsa": (lambda: DSA_KEY, "ssh-dss keys are not accepted"),
    "rsa-1024": (lambda: key_pair("rsa-1024").public_line, "RSA key of 1024 bits"),
    "garbage": (lambda: "hello world", "is not an OpenSSH public key"),
    "bad-base64": (lambda: "ssh-ed25519 AAAA!!!! me", "not valid base64"),
    "truncated": (lambda: key_pair().public_line.split()[0] + " AAAAC3NzaC1lZDI1NTE5",
                  "does not parse"),
    "type-mismatch": (lambda: "ssh-rsa " + key_pair().public_line.split()[1],
                      "does not parse"),
    "private-key": (_private_pem, "is a private key"),
    "options": (lambda: 'command="/bin/sh",no-pty ' + key_pair().public_line,
                "starts with options"),
    "nul": (lambda: key_pair().public_line + "\x00", "NUL"),
    "too-long": (lambda: key_pair().public_line + " " + "x" * 9000, "too long"),
    "two-lines": (lambda: key_pair().public_line + "\n" + key_pair().public_line,
                  "several lines"),
    "empty": (lambda: "   ", "is empty"),
    "certificate": (lambda: "ssh-ed25519-cert-v01@openssh.com AAAA me", "not accepted"),
    "security-key": (lambda: "sk-ssh-ed25519@openssh.com AAAA me", "not accepted"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_key_that_is_not_accepted_is_a_400_naming_the_problem(case):
    buyer = funded_buyer(10)
    make, says = REFUSED[case]
    text = make()
    r = client_for(buyer).post(URL, {"name": "k", "public_key": text}, format="json")
    assert_refused(r, "public_key", contains=says)
    assert not SshKey.objects.exists()
    if case == "private-key":  # never echoed back
        assert text.splitlines()[1] not in r.content.decode()


def test_the_same_key_twice_and_the_21st_key_are_refused():
    buyer = funded_buyer(10)
    client = client_for(buyer)
    pair = key_pair()
    assert client.post(URL, {"name": "a", "public_key": pair.public_line},
                       format="json").status_code == 201
    again = client.post(URL, {"name": "b", "public_key": pair.public_line}, format="json")
    assert_refused(again, "public_key", contains="already on your account")
    for i in range(MAX_KEYS - 1):
        assert client.post(URL, {"name": f"k{i}", "public_key": key_pair().public_line},
                           format="json").status_code == 201
    r = client.post(URL, {"name": "one too many", "public_key": key_pair().public_line},
                    format="json")
    assert_refused(r, "public_key", contains=f"{MAX_KEYS} SSH keys")
    assert SshKey.objects.filter(owner=buyer).count() == MAX_KEYS
    # another user's count is theirs alone
    assert client_for(funded_buyer(1)).post(
        URL, {"name": "a", "public_key": pair.public_line}, format="json").status_code == 201


@pytest.mark.parametrize(("name", "says"), [("a\nb", "control characters"),
                                            ("x" * 101, "at most 100"), (5, "string")])
def test_a_bad_name_is_refused(name, says):
    r = client_for(funded_buyer(10)).post(
        URL, {"name": name, "public_key": key_pair().public_line}, format="json")
    assert_refused(r, "name")
    assert not SshKey.objects.exists()


def _market():
    provider, node, token = registered_node()
    ask(provider, node, price=2_000_000)
    return provider, node, token


def _running(token, lease_id, host_port=40123, host="gpu-host.example"):
    runner = runner_client(token)
    url = f"/api/v1/runner/leases/{lease_id}/events/"
    assert runner.post(url, {"status": "starting"}, format="json").status_code == 200
    r = runner.post(url, {"status": "running", "container_id": "c0ffee", "endpoints": [
        {"container_port": 22, "host": host, "host_port": host_port}]}, format="json")
    assert r.status_code == 200, r.content


def test_a_lease_with_ssh_gets_the_keys_of_that_moment_and_its_buyer_the_command():
    provider, _, token = _market()
    buyer = funded_buyer(100)
    client = client_for(buyer)
    laptop, desk = key_pair(), key_pair("ecdsa-256")
    laptop_id = client.post(URL, {"name": "laptop", "public_key": laptop.public_line},
                            format="json").json()["id"]
    client.post(URL, {"name": "desk", "public_key": desk.public_line}, format="json")

    r = client.post("/api/v1/orders/", bid_body(gpus=1, ssh=True), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["ports"] == [22] and r.json()["port_roles"] == {"22": "ssh"}
    (first,) = r.json()["leases"]
    base = lambda line: " ".join(line.split()[:2])  # noqa: E731
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert [base(k) for k in listed["ssh_authorized_keys"]] == [base(laptop.public_line),
                                                                base(desk.public_line)]
    assert listed["ssh_authorized_keys"][0].endswith(" laptop")
    assert listed["ports"] == [22] and listed["port_roles"] == {"22": "ssh"}

    lease = client.get(f"/api/v1/leases/{first}/").json()
    assert lease["ssh"] is True and lease["connect"] == {"ssh": None, "jupyter": None,
                                                         "http": []}
    _running(token, first)
    lease = client.get(f"/api/v1/leases/{first}/").json()
    assert lease["connect"]["ssh"] == "ssh -p 40123 root@gpu-host.example"
    # the provider sees the lease, not how to get into it
    assert client_for(provider).get(f"/api/v1/leases/{first}/").json()["connect"] is None
    row = Lease.objects.get(pk=first)
    assert lease_payload(row, "buyer")["connect"]["ssh"] == "ssh -p 40123 root@gpu-host.example"
    assert lease_payload(row, "provider")["connect"] is None

    # a key deleted from the account is not in the next lease; the first keeps its own
    assert client.delete(f"{URL}{laptop_id}/").status_code == 204
    (second,) = client.post("/api/v1/orders/", bid_body(gpus=1, ssh=True),
                            format="json").json()["leases"]
    assert [base(k) for k in Lease.objects.get(pk=second).ssh_public_keys] == [
        base(desk.public_line)]
    assert len(Lease.objects.get(pk=first).ssh_public_keys) == 2


def test_a_lease_without_ssh_gets_no_key_and_no_port_22():
    _, _, token = _market()
    buyer = funded_buyer(100)
    client_for(buyer).post(URL, {"name": "k", "public_key": key_pair().public_line},
                           format="json")
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=1), format="json")
    (lease_id,) = r.json()["leases"]
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["ssh_authorized_keys"] == [] and listed["ports"] == []
    assert Lease.objects.get(pk=lease_id).ssh_public_keys == []


def test_ssh_must_be_a_boolean_and_is_for_bids_only():
    provider, node, _ = _market()
    buyer = funded_buyer(100)
    assert_refused(client_for(buyer).post("/api/v1/orders/", bid_body(ssh="yes"),
                                          format="json"), "ssh")
    assert_refused(client_for(provider).post("/api/v1/orders/", ask_body(node, ssh=True),
                                             format="json"), "ssh", contains="for bids")
    assert not Lease.objects.exists()


def test_a_sealed_bid_with_ssh_wins_a_lease_with_the_keys():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    pair = key_pair()
    client_for(buyer).post(URL, {"name": "k", "public_key": pair.public_line}, format="json")
    now = timezone.now()
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=1,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=now + timedelta(minutes=5))
    r = client_for(buyer).post(f"/api/v1/auctions/{auction.pk}/bids/",
                               {"price": "2.00", "ssh": True}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["ssh"] is True and r.json()["ports"] == [22]
    auctions.close_auction(auction_id=auction.pk, now=now + timedelta(minutes=6))
    lease = Lease.objects.get(sealed_bid_id=r.json()["id"])
    assert [" ".join(k.split()[:2]) for k in lease.ssh_public_keys] == [
        " ".join(pair.public_line.split()[:2])]
    assert lease.ports == [22] and lease.port_roles == {"22": "ssh"}
