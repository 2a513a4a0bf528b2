"""`gpumarket login/logout`, the config file and the exit statuses, against a live server
(conftest.py)."""

from __future__ import annotations

import json
import stat

import httpx

from tests.factories import UserFactory
from tests.support.net import free_port

from .conftest import PASSWORD


def _me(url: str, token: str) -> int:
    return httpx.get(f"{url}/api/v1/me/", headers={"Authorization": f"Bearer {token}"},
                     timeout=10).status_code


def test_login_with_a_password_saves_the_token_0600_and_never_prints_it(gm):
    user = UserFactory()
    done = gm("login", "--url", gm.url, "--username", user.username, stdin=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    saved = json.loads(gm.config.read_text())
    assert stat.S_IMODE(gm.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(gm.config.parent.stat().st_mode) == 0o700
    assert saved["url"] == gm.url and saved["username"] == user.username
    assert saved["token"] not in done.stdout + done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert f"logged in to {gm.url} as {user.username}" in done.stdout
    assert _me(gm.url, saved["token"]) == 200
    wallet = gm("wallet", "--json")
    assert wallet.returncode == 0, wallet.stderr
    assert json.loads(wallet.stdout)["available"] == "0.000000"


def test_a_wrong_password_exits_3_in_one_line_and_saves_nothing(gm):
    user = UserFactory()
    done = gm("login", "--url", gm.url, "--username", user.username, stdin="wrong-one\n")
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert line.startswith("gpumarket: ") and "unable to log in" in line
    assert not gm.config.exists()


def test_a_config_file_other_users_may_read_is_refused(gm):
    token = gm.login(UserFactory())
    gm.config.chmod(0o644)
    for args in (("wallet",), ("login", "--url", gm.url, "--token", token)):
        done = gm(*args)
        assert done.returncode == 3, args
        [line] = done.stderr.splitlines()
        assert "readable by other users (mode 0644)" in line and f"chmod 600 {gm.config}" in line
        assert token not in done.stdout + done.stderr
    gm.config.chmod(0o600)
    assert gm("wallet").returncode == 0


def test_logout_revokes_the_token_on_the_server(gm):
    token = gm.login(UserFactory())
    assert _me(gm.url, token) == 200
    done = gm("logout")
    assert done.returncode == 0, done.stderr
    assert _me(gm.url, token) == 401
    assert "token" not in json.loads(gm.config.read_text())
    after = gm("wallet")
    assert after.returncode == 3
    assert "not logged in" in after.stderr


def test_a_refused_token_exits_3_and_says_log_in_again(gm):
    gm.login(UserFactory())
    done = gm("wallet", GPUMARKET_TOKEN="not-a-token")
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert "refused the token" in line and "gpumarket login" in line


def test_not_logged_in_exits_3_and_no_server_exits_4(gm):
    none = gm("orders")
    assert none.returncode == 3
    assert none.stderr.strip() == ("gpumarket: not logged in: run `gpumarket login --url "
                                   "https://MARKETPLACE` first")
    gone = gm("markets", "--url", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == 4
    [line] = gone.stderr.splitlines()
    assert line.startswith("gpumarket: cannot reach http://127.0.0.1:")
    assert "Traceback" not in gone.stderr
    # no token for that URL: nothing there is exit 4, a server there exit 3
    nowhere = gm("wallet", "--url", f"http://127.0.0.1:{free_port()}")
    assert nowhere.returncode == 4 and "cannot reach" in nowhere.stderr
    there = gm("wallet", "--url", gm.url)
    assert there.returncode == 3 and f"not logged in to {gm.url}" in there.stderr
