"""The buyer CLI's plain parts, without a server: money, the log-tail diff, NAME=VALUE
options, the one-line refusal, the config file's mode check."""

from __future__ import annotations

import importlib
import tomllib
from datetime import UTC, datetime

import pytest

from buyer_cli import cli, config, render
from buyer_cli.api import Api, refusal_line
from buyer_cli.bidding import pairs
from buyer_cli.follow import lease_in, new_lines, progress_line
from buyer_cli.money import lease_cost, parse_usd, shown, usd
from tests.conftest import ROOT


def test_money_is_exact_integers_and_six_decimals():
    assert parse_usd("2.49") == 2_490_000
    assert parse_usd("0.000001") == 1
    assert usd(333) == "0.000333" and usd(-2_490_000) == "-2.490000"
    assert shown("2.49") == "$2.490000" and shown("-0.5") == "$-0.500000" and shown(None) == "-"
    assert lease_cost(2_490_000, 3, 1801) == 2_490_000 * 3 * 1801 // 3600
    for bad in ("2.4900001", "1e3", "NaN", "-1", "1,000", "", " "):
        with pytest.raises(ValueError):
            parse_usd(bad)


def test_new_lines_skips_what_the_previous_tail_showed():
    assert new_lines("", "a\nb\n") == ["a", "b"]
    assert new_lines("a\nb\n", "a\nb\nc\n") == ["c"]
    assert new_lines("a\nb\nc\n", "b\nc\nd\n") == ["d"]  # the tail's head scrolled off
    assert new_lines("a\nb\n", "x\ny\n") == ["x", "y"]
    assert new_lines("a\nb\n", "a\nb\n") == []


def test_a_snapshot_without_the_lease_means_it_ended():
    assert lease_in({"type": "snapshot", "leases": [{"id": 2}]}, 1) is False
    assert lease_in({"type": "snapshot", "leases": [{"id": 1, "status": "running"}]}, 1) \
        == {"id": 1, "status": "running"}
    assert lease_in({"type": "lease", "lease": {"id": 3}}, 1) is None
    assert lease_in({"type": "balance"}, 1) is None


def test_pairs_read_secret_files_and_never_echo_a_value(tmp_path):
    file = tmp_path / "token"
    file.write_text("s3cr3t\n")
    assert pairs(["A=1", f"T=@{file}", "E="], "--secret", files=True) == \
        {"A": "1", "T": "s3cr3t", "E": ""}
    assert pairs(["T=@literal"], "--env") == {"T": "@literal"}
    for values, says in ((["s3cr3t"], "(the 1st one) is not NAME=VALUE"),
                         (["A=s3cr3t", "A=s3cr3t"], "A is given twice"),
                         ([f"T=@{tmp_path / 'none'}"], "cannot read the file")):
        with pytest.raises(config.CliError) as refused:
            pairs(values, "--secret", files=True)
        assert refused.value.code == config.EXIT_USAGE
        assert says in str(refused.value) and "s3cr3t" not in str(refused.value)


def test_a_refusal_is_one_line_with_every_named_field():
    body = {"detail": "price: must be greater than zero",
            "errors": {"price": ["must be greater than zero"], "gpus": ["too\nmany"]}}
    assert refusal_line(400, body) == "price: must be greater than zero; gpus: too many"
    assert refusal_line(409, {"detail": "beyond the ask's window"}) == "beyond the ask's window"
    assert refusal_line(502, None) == "the server answered 502"


def test_the_config_file_is_written_0600_and_refused_when_others_may_read_it(tmp_path):
    path = tmp_path / "gpumarket" / "config.json"
    config.save(path, {"url": "http://x", "token": "t"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert config.load(path)["token"] == "t"
    path.chmod(0o640)
    with pytest.raises(config.CliError) as refused:
        config.load(path)
    assert refused.value.code == config.EXIT_AUTH and "mode 0640" in str(refused.value)


def test_the_config_path_follows_the_flag_the_variable_then_xdg(tmp_path):
    home = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert config.config_path(None, home) == tmp_path / "gpumarket" / "config.json"
    assert config.config_path(None, {**home, "GPUMARKET_CONFIG": "/a.json"}).as_posix() == \
        "/a.json"
    assert config.config_path("/b.json", {"GPUMARKET_CONFIG": "/a.json"}).as_posix() == \
        "/b.json"
    # a token saved for one server is never sent to another
    assert config.server({"url": "http://a", "token": "t"}, "http://b", {}) == ("http://b", None)
    assert config.server({"url": "http://a/", "token": "t"}, None, {}) == ("http://a", "t")


def test_gpumarket_is_a_console_script_of_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["scripts"]["gpumarket"]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    assert "buyer_cli*" in project["tool"]["setuptools"]["packages"]["find"]["include"]


def test_a_running_lease_shows_its_cost_so_far_by_the_billing_rule():
    lease = {"id": 7, "status": "running", "price": "2.490000", "gpu_count": 3,
             "started_at": "2026-12-01T10:00:00Z", "ends_at": "2026-12-01T12:00:00+00:00",
             "cost": "0.000000", "duration_seconds": 7200}
    now = datetime(2026, 12, 1, 10, 30, 1, tzinfo=UTC)
    assert 2_490_000 * 3 * 1801 // 3600 == 3_737_075  # micro-USD: the floor, never a float
    assert ("cost:     $0.000000 (running: $3.737075 for 1801 s so far, 5399 s left)"
            in render.lease(lease, now).splitlines())
    ended = {**lease, "status": "completed", "cost": "3.737075"}
    assert "cost:     $3.737075" in render.lease(ended, now).splitlines()


def test_ssh_takes_its_options_before_and_the_ssh_arguments_after_the_double_dash():
    for argv, json_, extra in (
        (["ssh", "7", "--json"], True, []),
        (["ssh", "7", "--", "-o", "BatchMode=yes", "nvidia-smi"], False,
         ["-o", "BatchMode=yes", "nvidia-smi"]),
        (["--json", "ssh", "7", "--", "-v"], True, ["-v"]),
        (["ssh", "7", "--json", "--", "--", "x"], True, ["--", "x"]),
    ):
        args = cli.parse(argv)
        assert (args.lease, args.json, args.extra) == (7, json_, extra), argv
    with pytest.raises(SystemExit) as usage:
        cli.parse(["ssh", "7", "-v"])  # ssh's own options go after --
    assert usage.value.code == config.EXIT_USAGE


def test_a_token_no_header_can_carry_is_refused_without_showing_it():
    for token in ("abc def-s3cr3t", "s3cr3t\n", "s3cr3t\u00e9"):
        with pytest.raises(config.CliError) as refused:
            Api("http://127.0.0.1:9", token)
        assert refused.value.code == config.EXIT_AUTH and "s3cr3t" not in str(refused.value)


def test_the_human_lines_show_what_was_paid_and_when_a_lease_ended():
    """A lease's price, not the bid's; a won sealed bid's paid_price and lease; "—" for no
    reference price; the end of an ended lease; "running" said once."""
    order = {"id": 10, "status": "filled", "gpus": 1, "gpu_class": "h100", "price": "2.600000",
             "duration_seconds": 3600, "remaining_gpus": 0, "leases": [5]}
    line = render.order_placed(order, [{"id": 5, "price": "2.000000"}])
    assert "bid at $2.600000/GPU-h" in line and "lease 5 at $2.000000/GPU-h" in line
    won = render.sealed_bid({"id": 3, "auction": 2, "status": "won", "gpus": 4, "price": "1.9",
                             "awarded_gpus": 4, "paid_price": "1.300000", "lease": 8})
    assert "paying $1.300000/GPU-h: lease 8" in won
    assert render.markets([{"slug": "t4", "reference_price": "0.000000"}]).splitlines()[1] \
        .split()[-1] == "—"
    ended = {"id": 5, "status": "completed", "ends_at": "2026-01-01T02:00:00Z",
             "ended_at": "2026-01-01T00:10:00Z"}
    assert "2026-01-01T00:10:00Z" in render.leases([ended])
    assert "2026-01-01T02:00:00Z" not in render.leases([ended])
    assert progress_line({"id": 5, "status": "running"}) == "lease 5: running"
    pulling = "pulling image r:1: 312 MiB of 1024 MiB (30 %), 1 of 3 layers"
    assert progress_line({"id": 5, "status": "starting", "progress": pulling}) == \
        f"lease 5: starting — {pulling}"  # the runner's pull progress (docs/IMAGES.md)
    assert progress_line({"id": 5, "status": "running", "progress": pulling}) == \
        "lease 5: running"
