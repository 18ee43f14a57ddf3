"""How `Settings.from_env` parses the environment, and that `Settings(...)` never reads it:
the parsing every setting relied on before the fields were declared with pydantic."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.platform.settings import ROOT, Settings, SettingsError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No setting from the shell that runs the tests."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_plain_construction_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_MAX_ATTEMPTS", "9")
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere/db")
    assert Settings().job_max_attempts == 3
    assert Settings(database_url="postgresql://mine/db").database_url == "postgresql://mine/db"
    assert Settings.from_env().job_max_attempts == 9


def test_only_the_capitalised_name_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("job_max_attempts", "9")
    assert Settings.from_env().job_max_attempts == 3


@pytest.mark.parametrize(
    "name",
    ["JOB_MAX_ATTEMPTS", "DRAIN_SECONDS", "JOBS_QUEUE", "VAR_DIR", "WORKER_QUEUES",
     "CUDA_DEVICES", "WEBHOOK_RETRY_SCHEDULE", "WEBHOOK_ALLOW_PRIVATE_NETWORKS"],
)  # fmt: skip
def test_an_empty_variable_means_the_default(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "")
    assert Settings.from_env() == Settings()


def test_numbers_paths_and_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_MAX_ATTEMPTS", " 5 ")
    monkeypatch.setenv("TENANT_MAX_SUBMITS_PER_SECOND", "2.5")
    monkeypatch.setenv("MODEL_REPOSITORY", "/srv/models")
    monkeypatch.setenv("ORT_PROVIDER", "CPU")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    monkeypatch.setenv("LOG_FORMAT", "JSON")
    settings = Settings.from_env()
    assert settings.job_max_attempts == 5
    assert settings.tenant_max_submits_per_second == 2.5
    assert settings.model_repository == Path("/srv/models")
    assert (settings.ort_provider, settings.log_level, settings.log_format) == (
        "cpu", "DEBUG", "json",
    )  # fmt: skip


def test_comma_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_QUEUES", " gpu, inference ,")
    monkeypatch.setenv("WEBHOOK_ALLOWED_NETWORKS", "10.0.0.0/8,,127.0.0.2/32")
    monkeypatch.setenv("CUDA_DEVICES", " 0, 1,")
    monkeypatch.setenv("WEBHOOK_RETRY_SCHEDULE", "0, 2.5,60")
    settings = Settings.from_env()
    assert settings.worker_queues == ("gpu", "inference")
    assert settings.webhook_allowed_networks == ("10.0.0.0/8", "127.0.0.2/32")
    assert settings.cuda_devices == (0, 1)
    assert settings.webhook_retry_schedule == (0.0, 2.5, 60.0)


@pytest.mark.parametrize(
    ("raw", "on"),
    [("1", True), ("true", True), ("YES", True), ("0", False), ("false", False),
     ("on", False), ("whatever", False)],
)  # fmt: skip
def test_the_private_networks_switch(raw: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_ALLOW_PRIVATE_NETWORKS", raw)
    assert Settings.from_env().webhook_allow_private_networks is on


def test_data_dir_follows_var_dir_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().data_dir == ROOT / "var" / "data"
    monkeypatch.setenv("VAR_DIR", "/srv/var")
    assert Settings.from_env().data_dir == Path("/srv/var/data")
    monkeypatch.setenv("DATA_DIR", "/mnt/shared")
    assert Settings.from_env().data_dir == Path("/mnt/shared")


@pytest.mark.parametrize(
    ("name", "raw", "said"),
    [
        ("JOB_MAX_ATTEMPTS", "abc", "JOB_MAX_ATTEMPTS='abc': Input should be a valid integer"),
        ("DRAIN_SECONDS", "fast", "DRAIN_SECONDS='fast': Input should be a valid number"),
        ("CUDA_DEVICES", "0,x", "CUDA_DEVICES='0,x' (item 2: 'x'): Input should be a valid"),
        ("WEBHOOK_RETRY_SCHEDULE", "5,,300", "WEBHOOK_RETRY_SCHEDULE='5,,300' (item 2: '')"),
        ("FILE_STORE_OPTIONS", '["a"]', "FILE_STORE_OPTIONS='[\"a\"]': Value error, expected"),
    ],
)
def test_a_wrong_value_names_its_variable(
    name: str, raw: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingsError) as raised:
        Settings.from_env()
    assert said in str(raised.value)


def test_fields_keep_their_types_and_settings_stay_frozen() -> None:
    settings = Settings(var_dir="/srv/var", worker_queues=["gpu"])  # type: ignore[arg-type]
    assert settings.var_dir == Path("/srv/var")
    assert settings.worker_queues == ("gpu",)
    assert hash(settings) == hash(Settings(var_dir=Path("/srv/var"), worker_queues=("gpu",)))
    with pytest.raises(ValidationError):
        settings.jobs_queue = "other"


def test_file_store_options_are_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FILE_STORE_OPTIONS", '{"endpoint_url": "http://minio:9000"}')
    settings = Settings.from_env()
    assert settings.store_options == {"endpoint_url": "http://minio:9000"}
    assert hash(settings)  # kept as text: the settings stay hashable
    assert Settings().store_options == {}


def test_with_overrides_checks_what_it_changes() -> None:
    base = Settings(jobs_queue="mine")
    changed = base.with_overrides(job_max_attempts="4")
    assert (changed.job_max_attempts, changed.jobs_queue, base.job_max_attempts) == (4, "mine", 3)
    with pytest.raises(ValidationError):
        base.with_overrides(no_such_setting=1)
    with pytest.raises(ValidationError):
        base.with_overrides(job_max_attempts="many")


def test_secrets_stay_out_of_repr() -> None:
    shown = repr(Settings(secret_key="s3cret", flower_basic_auth="ops:pw"))
    assert "s3cret" not in shown and "ops:pw" not in shown
