"""GPUMARKET_SECRETS_KEY (marketplace/settings.py): required with DEBUG=0, refused in one
line naming the key's position (never the key) when it is not a Fernet key, several keys
accepted (rotation)."""

from __future__ import annotations

from cryptography.fernet import Fernet

from tests.test_deploy_settings import _django

SHOW = "import django; django.setup(); from django.conf import settings as s; " \
       "print(len(s.GPUMARKET_SECRETS_KEYS))"


def test_debug_off_without_a_key_refuses_to_start_in_one_line(tmp_path):
    done = _django(tmp_path, "manage.py", "check", GPUMARKET_SECRETS_KEY="")
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("manage.py: the configuration is not usable: "
                           "GPUMARKET_SECRETS_KEY is required when DEBUG is off"), line


def test_a_key_that_is_not_fernet_is_named_by_position_and_not_echoed(tmp_path):
    good = Fernet.generate_key().decode()
    done = _django(tmp_path, "manage.py", "check",
                   GPUMARKET_SECRETS_KEY=f"{good},not-a-fernet-key-4711")
    assert done.returncode == 1
    assert "GPUMARKET_SECRETS_KEY: key 2 of 2 is not a Fernet key" in done.stderr
    assert "4711" not in done.stderr + done.stdout and good not in done.stderr


def test_several_keys_for_rotation_and_a_derived_key_with_debug(tmp_path):
    keys = ",".join(Fernet.generate_key().decode() for _ in range(2))
    done = _django(tmp_path, "-c", SHOW, GPUMARKET_SECRETS_KEY=keys)
    assert done.stdout.split() == ["2"], done.stderr
    done = _django(tmp_path, "-c", SHOW, DEBUG="1", GPUMARKET_SECRETS_KEY="")
    assert done.stdout.split() == ["1"], done.stderr
