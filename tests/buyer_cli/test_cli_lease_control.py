"""`gpumarket` against issue 12's endpoints and fields (templates, SSH keys, `connect`,
env/secrets, stop, extend), as docs/CLI.md describes them, against a live server like the
other CLI tests."""

from __future__ import annotations

import json
import shlex
import stat

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.factories import H100, with_ssh_key

IMAGE = "gpumarket/busybox:local"


def _lease(gm, market, *extra: str) -> int:
    gm.login(market.buyer)
    done = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--json",
              *(extra or ("--image", IMAGE)))
    assert done.returncode == 0, done.stderr
    [lease_id] = json.loads(done.stdout)["leases"]
    return lease_id


def test_stop_ends_a_running_lease_and_a_second_stop_answers_the_same(gm, market):
    lease_id = _lease(gm, market)
    market.run(lease_id)
    first = gm("stop", str(lease_id), "--json")
    assert first.returncode == 0, first.stderr
    stopped = json.loads(first.stdout)
    again = gm("stop", str(lease_id), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == stopped["id"] == lease_id
    human = gm("stop", str(lease_id))
    assert human.stdout.startswith(f"lease {lease_id}: ") and "cost $" in human.stdout


def test_extend_runs_longer_or_exits_1_saying_why(gm, market):
    lease_id = _lease(gm, market)
    market.run(lease_id)
    done = gm("extend", str(lease_id), "--hours", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["id"] == lease_id
    beyond = gm("extend", str(lease_id), "--hours", str(24 * 365))  # past the ask's window
    assert beyond.returncode == 1
    [line] = beyond.stderr.splitlines()
    assert line.startswith("gpumarket: ") and "Traceback" not in beyond.stderr
    usage = gm("extend", str(lease_id))
    assert usage.returncode == 2 and "one of the arguments --hours --seconds" in usage.stderr


def test_extend_with_one_request_id_twice_extends_once(gm, market):
    lease_id = _lease(gm, market)
    market.run(lease_id)
    first = gm("extend", str(lease_id), "--hours", "1", "--request-id", "k-1", "--json")
    assert first.returncode == 0, first.stderr
    again = gm("extend", str(lease_id), "--hours", "1", "--request-id", "k-1", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["ends_at"] == json.loads(first.stdout)["ends_at"]
    other = gm("extend", str(lease_id), "--hours", "1", "--json")  # a new key: once more
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["ends_at"] > json.loads(first.stdout)["ends_at"]
    clash = gm("extend", str(lease_id), "--hours", "2", "--request-id", "k-1")
    assert clash.returncode == 1 and "request_id" in clash.stderr


def _public_key(tmp_path, comment: str = "laptop"):
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    path = tmp_path / "id_ed25519.pub"
    path.write_text(f"{public} {comment}\n")
    private = tmp_path / "id_ed25519"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    return path, private


def test_ssh_keys_add_list_delete(gm, market, tmp_path):
    gm.login(market.buyer)
    public, private = _public_key(tmp_path)
    added = gm("ssh-keys", "add", str(public), "--json")
    assert added.returncode == 0, added.stderr
    key = json.loads(added.stdout)
    assert key["name"] == "laptop" and key["type"] == "ssh-ed25519"
    assert key["fingerprint"].startswith("SHA256:")
    listed = gm("ssh-keys", "list")
    assert any(line.split()[:2] == [str(key["id"]), "laptop"]
               for line in listed.stdout.splitlines()), listed.stdout
    refused = gm("ssh-keys", "add", str(private))
    assert refused.returncode == 2 and "is a private key" in refused.stderr
    assert "PRIVATE" not in refused.stderr
    assert gm("ssh-keys", "delete", str(key["id"])).returncode == 0
    assert json.loads(gm("ssh-keys", "list", "--json").stdout)["results"] == []
    gone = gm("ssh-keys", "delete", str(key["id"]))
    assert gone.returncode == 1 and len(gone.stderr.splitlines()) == 1


def test_ssh_execs_the_leases_own_ssh_command_with_the_extra_arguments(gm, market, tmp_path):
    with_ssh_key(market.buyer)  # a bid with ssh needs a key on the account
    lease_id = _lease(gm, market, "--image", IMAGE, "--ssh")
    waiting = gm("ssh", str(lease_id))
    assert waiting.returncode == 1 and f"gpumarket wait {lease_id}" in waiting.stderr
    market.run(lease_id, endpoints=[{"container_port": 22, "host": "127.0.0.1",
                                     "host_port": 40123}])
    command = json.loads(gm("lease", str(lease_id), "--json").stdout)["connect"]["ssh"]
    assert command == "ssh -p 40123 root@127.0.0.1"
    # an `ssh` on PATH that writes down how it was called: the exec itself is what is tested
    shim, record = tmp_path / "bin" / "ssh", tmp_path / "argv.json"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec python3 -c 'import json,sys; "
                    f"json.dump(sys.argv[1:], open(\"{record}\", \"w\"))' \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    done = gm("ssh", str(lease_id), "--", "-o", "BatchMode=yes", "nvidia-smi",
              PATH=f"{shim.parent}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text()) == [*shlex.split(command)[1:], "-o",
                                              "BatchMode=yes", "nvidia-smi"]
    dry = json.loads(gm("ssh", str(lease_id), "--json").stdout)
    assert dry["argv"] == shlex.split(command)


def test_env_and_a_secret_from_a_file_are_sent_and_the_secret_never_shown(gm, market,
                                                                         tmp_path):
    secret = tmp_path / "hf_token"
    secret.write_text("hf_very_secret_value\n")
    gm.login(market.buyer)
    done = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--image", IMAGE,
              "--env", "EPOCHS=3", "--secret", f"HF_TOKEN=@{secret}",
              "--secret", "B=second-secret-value", "--json")
    assert done.returncode == 0, done.stderr
    [lease_id] = json.loads(done.stdout)["leases"]
    shown = gm("lease", str(lease_id))
    as_json = gm("lease", str(lease_id), "--json")
    for text in (done.stdout, shown.stdout, as_json.stdout):
        assert "hf_very_secret_value" not in text and "second-secret-value" not in text
    lease = json.loads(as_json.stdout)
    assert lease["env"]["EPOCHS"] == "3"
    assert lease["secret_names"] == ["B", "HF_TOKEN"]
    assert "secrets:  B, HF_TOKEN (values never shown)" in shown.stdout
    bad = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--image", IMAGE,
             "--secret", "not-a-name=hunter2")
    assert bad.returncode == 1 and "secrets" in bad.stderr and "hunter2" not in bad.stderr


def test_templates_are_listed_and_a_bid_may_name_one(gm, market):
    gm.login(market.buyer)
    listed = gm("templates", "--json")
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)["results"]
    assert items and all({"id", "title", "image", "ports", "min_cuda"} <= set(t) for t in items)
    human = gm("templates").stdout.splitlines()
    assert human[0].split() == ["ID", "TITLE", "IMAGE", "PORTS", "MIN", "CUDA"]
    ready = next(t for t in items if t["image"])
    with_ssh_key(market.buyer)  # the first templates have ssh, which needs a key
    placed = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1",
                "--template", ready["id"], "--json")  # the template gives the image
    assert placed.returncode == 0, placed.stderr
    assert json.loads(placed.stdout)["status"] in ("open", "filled")
    unknown = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1",
                 "--template", "no-such-template")
    assert unknown.returncode == 1 and "template" in unknown.stderr
