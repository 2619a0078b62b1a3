"""Client credentials from a YAML/JSON file or a Secret directory, reloaded on change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.s3.credentials import CredentialsError, CredentialStore, load_credentials


class FakeMonotonic:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_credentials_yaml_and_json_files(tmp_path: Path) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text("AK1: s1\nAK2: 's2: with colon'\n")
    assert load_credentials(yml) == {"AK1": "s1", "AK2": "s2: with colon"}
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"AK3": "s3"}))
    assert load_credentials(js) == {"AK3": "s3"}


@pytest.mark.parametrize("text", ["[1, 2]", "AK1: 5", "{}", "AK1: [unclosed", ""])
def test_credentials_malformed_file_names_no_secret(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CredentialsError) as exc:
        load_credentials(path)
    assert "unclosed" not in str(exc.value)


def test_credentials_directory_skips_dot_entries(tmp_path: Path) -> None:
    (tmp_path / "..data").mkdir()
    (tmp_path / "..2026_11_23").write_text("ignored")
    (tmp_path / "AKDIR").write_text("secret\n")
    assert load_credentials(tmp_path) == {"AKDIR": "secret"}


def test_credentials_store_reloads_after_interval_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("AK1: s1\n")
    clock = FakeMonotonic()
    store = CredentialStore({"STATIC": "st"}, path, check_interval_s=2.0, monotonic=clock)
    assert dict(store) == {"STATIC": "st", "AK1": "s1"}
    path.write_text("AK1: rotated\nAK2: s2\n")
    assert store["AK1"] == "s1"  # not re-read before the interval
    clock.now_s = 3.0
    assert store["AK1"] == "rotated" and store["AK2"] == "s2" and store["STATIC"] == "st"
    path.write_text("not: [valid")
    clock.now_s = 6.0
    assert store["AK2"] == "s2"  # a broken file keeps the last good table
    assert "AK9" not in store


def test_credentials_store_without_file_is_static() -> None:
    store = CredentialStore({"AK": "s"})
    assert dict(store) == {"AK": "s"} and len(store) == 1
